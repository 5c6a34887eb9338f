"""The frames LeRobot's statistics of one camera could sample, kept until the attempt's length is known.

LeRobot's camera statistics use the frames ``sample_indices(N)`` picks, and N is known only when the attempt
ends; for every frame there is a length that picks it, so no frame can be dropped early. Each frame's strided
pixels (what ``auto_downsample_height_width`` keeps: the whole frame below 300 px, about 150 px above) are
appended to an unlinked temporary file, which the kernel's page cache holds and which never outlives the
process; when the attempt ends, the sampled frames are read back and summed (``storage/lerobot_stats.py``),
and the file is closed. Memory stays at one frame whatever the episode length; the file holds at most
N x (strided frame) bytes (150 KB per 224x224 RGB frame) while the attempt runs.

A strided RGB frame is kept as its three planes, (3, h, w): numpy copies a strided (h, w, 3) view one 3-byte
pixel at a time, and one channel at a time takes half the time or less (the sums read any layout). A frame
kept whole is copied as it is (a plain memory copy, faster than planes).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO

import numpy as np

from demoforge.storage.lerobot_stats import FeatureStats, RgbStats, depth_stats, sample_indices, strided
from demoforge.storage.schema import CameraSpec
from demoforge.storage.write_errors import writing


class SampledFrames:
    """One camera of one attempt: :meth:`add` each frame as it is encoded, :meth:`statistics` at the end."""

    def __init__(self, camera: CameraSpec, spill_dir: Path | None = None) -> None:
        self.camera = camera
        self.frames = 0
        self._dtype = np.dtype(np.float32 if camera.is_depth else np.uint8)
        kept = strided(np.empty(camera.shape, self._dtype)).shape
        self._planar = not camera.is_depth and kept != tuple(camera.shape)
        self._shape = (3, *kept[:2]) if self._planar else kept
        self._frame_bytes = int(np.prod(self._shape)) * self._dtype.itemsize
        # A full disk here reaches a person like any other write: what was written, and where.
        self._what = f"the frames kept for camera {camera.name!r}'s statistics (a temporary file)"
        self._where = Path(spill_dir) if spill_dir is not None else Path(tempfile.gettempdir())
        with writing(self._what, self._where):
            # Unbuffered: every frame reaches the file when added (a full disk fails that add, named), and
            # closing writes nothing, so dropping an aborted attempt's frames cannot fail on a full disk.
            self._file: IO[bytes] | None = tempfile.TemporaryFile(dir=spill_dir, prefix="demoforge-stats-",
                                                                  buffering=0)

    def add(self, image: np.ndarray) -> None:
        """Keep the pixels of one frame LeRobot's statistics look at (a copy: the caller may reuse ``image``)."""
        assert self._file is not None, "add() after close()"
        view = strided(np.asarray(image, dtype=self._dtype))
        if self._planar:
            pixels = np.empty(self._shape, self._dtype)
            for c in range(3):
                np.copyto(pixels[c], view[..., c])
        else:
            pixels = np.ascontiguousarray(view)
        with writing(self._what, self._where):
            data = memoryview(pixels).cast("B")
            while data:  # a raw write may take part of the buffer
                data = data[os.write(self._file.fileno(), data):]
        self.frames += 1

    def _frame(self, index: int) -> np.ndarray:
        assert self._file is not None
        data = os.pread(self._file.fileno(), self._frame_bytes, index * self._frame_bytes)
        if len(data) != self._frame_bytes:
            raise OSError(f"camera {self.camera.name!r}: kept frame {index} reads back short")
        return np.frombuffer(data, self._dtype).reshape(self._shape)

    def statistics(self) -> FeatureStats:
        """LeRobot's statistics of this camera over the frames added (``compute_episode_stats``'s sample)."""
        assert self._file is not None, "statistics() after close()"
        indices = sample_indices(self.frames)
        if self.camera.is_depth:
            return depth_stats(np.stack([self._frame(i) for i in indices]))
        acc = RgbStats()
        add = acc.add_planar if self._planar else acc.add
        for i in indices:
            add(self._frame(i))
        return acc.result()

    def close(self) -> None:
        """Drop the kept frames (the file is unlinked already: closing frees its space and writes nothing)."""
        if self._file is not None:
            self._file.close()
            self._file = None
