"""Offline sampling: a ``torch.utils.data.Sampler[int]`` of segment-aware windows over an exported dataset.

:class:`SegmentWindowSampler` yields the dataset index of each window's first frame; give ``LeRobotDataset``
``delta_timestamps`` of ``[i / fps for i in range(C)]`` (:meth:`SegmentWindowSampler.delta_timestamps`) and
every item is exactly the window (no padding: windows never leave their episode). Window semantics:
``storage/sampling/window_index.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from demoforge.storage.lerobot.format import INFO, SIDECAR, read_sidecar
from demoforge.storage.schema import check_include, included
from demoforge.storage.sampling.window_index import (
    NoEligibleWindowError,
    WindowIndex,
    check_mode,
    chunk_delta_timestamps,
    segments_from_frames,
)

_BLOCK = 4096  # draws generated per numpy call (fixed: part of the reproducible stream)


class SegmentWindowSampler(Sampler[int]):
    """A ``torch.utils.data.Sampler[int]`` over an exported dataset (demoforge's LeRobot v3.0 export).

    Yields ``num_samples`` dataset indices, each the first frame of an eligible window; load the whole
    window with ``LeRobotDataset(..., delta_timestamps=sampler.delta_timestamps("action", ...))``.

    - ``mode``: ``"episode"``, ``"segment"`` or ``"boundary"`` (see the module docstring for the exact
      definitions); ``chunk_size``: frames per window; ``weighting``: ``"episode"`` (uniform over eligible
      episodes, then over that episode's windows) or ``"window"`` (uniform over all eligible windows).
    - Reproducible: the draws of an epoch are a pure function of ``(seed, epoch)`` (numpy's PCG64 seeded
      with ``SeedSequence([seed, epoch])``). As LeRobot's ``EpisodeAwareSampler``: each ``__iter__``
      advances the epoch; :meth:`set_epoch` positions it (use one of the two mechanisms).
    - Worker-safe: a DataLoader iterates its sampler in the main process and hands indices to workers, so
      ``num_workers > 0`` yields the same items in the same order as ``num_workers = 0``. The sampler holds
      only numpy arrays (it pickles for spawn-started workers too).
    - ``episodes``: restrict to these dataset episode indices; ``absolute_to_relative_idx``: LeRobotDataset's
      mapping for an episode-filtered dataset (yielded indices are then relative). :meth:`from_dataset`
      fills both from a loaded ``LeRobotDataset``. ``include``: ``"episodes"`` (the default: never a failure
      ``generate --keep-failures`` kept, exported with ``--include failures|all``), ``"failures"`` or ``"all"``.

    The index is built once from the data parquet's ``index``, ``episode_index``, ``annotation.valid`` and
    ``annotation.segment_id`` columns (only those columns are read): O(#frames). A dataset without
    annotation columns (not written by demoforge) supports ``mode="episode"`` only.
    """

    def __init__(self, root: str | Path, *, mode: str = "episode", chunk_size: int, num_samples: int | None = None,
                 weighting: str = "episode", seed: int = 0, episodes: Sequence[int] | None = None,
                 absolute_to_relative_idx: Mapping[int, int] | None = None, include: str = "episodes") -> None:
        super().__init__()
        check_mode(mode, chunk_size, weighting)
        check_include(include)
        self.root = Path(root).resolve()  # pin the published version (an export swaps the link)
        self.mode, self.chunk_size, self.weighting, self.seed = mode, int(chunk_size), weighting, int(seed)
        info = json.loads((self.root / INFO).read_text())
        self.fps = info["fps"]
        self.index = WindowIndex(mode, chunk_size)
        self.episode_of_slot = self._build(self._included(episodes, include))
        self._to_relative = dict(absolute_to_relative_idx) if absolute_to_relative_idx is not None else None
        if self.index.total_windows == 0:
            raise NoEligibleWindowError(self.index.describe_empty(f" of {self.root}"))
        self.num_samples = int(num_samples) if num_samples is not None else self.index.total_windows
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self._epoch = 0

    @classmethod
    def from_dataset(cls, dataset: Any, **kwargs: Any) -> SegmentWindowSampler:
        """A sampler for a loaded ``LeRobotDataset``: same root, same episodes, same index mapping.

        Restricted to the episodes the dataset object holds, so a newer export published after the dataset
        was loaded never yields an index the dataset lacks.
        """
        episodes = dataset.episodes if dataset.episodes is not None else range(dataset.meta.total_episodes)
        return cls(dataset.root, episodes=list(episodes),
                   absolute_to_relative_idx=dataset.absolute_to_relative_idx, **kwargs)

    def _included(self, episodes: Sequence[int] | None, include: str) -> Sequence[int] | None:
        """``episodes`` narrowed to what ``include`` takes, by each episode's sidecar record."""
        if include == "all" or not (self.root / SIDECAR).is_file():
            return episodes
        taken = {int(r["dataset_episode_index"]) for r in read_sidecar(self.root)
                 if included(include, bool(r.get("kept_failure", False)))}
        return sorted(taken if episodes is None else taken & {int(e) for e in episodes})

    def _build(self, episodes: Sequence[int] | None) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        files = sorted((self.root / "data").glob("*/*.parquet"))
        if not files:
            raise NoEligibleWindowError(f"{self.root} holds no data files; nothing to sample")
        names = set(pq.read_schema(files[0]).names)
        annotated = {"annotation.valid", "annotation.segment_id"} <= names
        if not annotated and self.mode != "episode":
            raise ValueError(f"{self.root} has no annotation.segment_id column (not a demoforge export): only "
                             "mode 'episode' is possible")
        columns = ["index", "episode_index"] + (["annotation.valid", "annotation.segment_id"] if annotated else [])
        table = pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
        if episodes is not None:
            table = table.filter(pc.is_in(table["episode_index"], pa.array(sorted(set(episodes)), pa.int64())))
        index = table["index"].to_numpy()
        order = np.argsort(index, kind="stable")
        index = index[order]
        ep = table["episode_index"].to_numpy()[order]
        if annotated:
            valid = table["annotation.valid"].to_numpy()[order]
            seg = table["annotation.segment_id"].to_numpy()[order]
        else:
            valid, seg = np.ones(len(index), np.int64), np.zeros(len(index), np.int64)
        self._label_frames(index, ep, seg)
        start, end, first = segments_from_frames(valid, seg, episode=ep, position=index)
        # slots: the dataset's episodes in index order (a slot per episode with frames)
        heads = np.flatnonzero(np.append(True, ep[1:] != ep[:-1])) if len(ep) else np.zeros(0, np.int64)
        episode_of_slot = ep[heads]
        slot_of_frame = np.cumsum(np.append(True, ep[1:] != ep[:-1])) - 1 if len(ep) else ep
        self.index.extend(start, end, slot_of_frame[first], len(heads))
        return episode_of_slot

    def _label_frames(self, index: np.ndarray, ep: np.ndarray, seg: np.ndarray) -> None:
        """Per frame (in index order): its segment id, and where its episode and its segment start and end."""
        n = len(index)
        new_episode = np.append(True, ep[1:] != ep[:-1]) if n else np.zeros(0, bool)
        new_segment = new_episode | (np.append(True, seg[1:] != seg[:-1]) if n else np.zeros(0, bool))
        self._frames = index
        self._segment = seg.astype(np.int64)
        for name, heads in (("episode", new_episode), ("segment", new_segment)):
            first = np.flatnonzero(heads)
            lengths = np.diff(np.append(first, n))
            owner = np.cumsum(heads) - 1
            setattr(self, f"_{name}_first", first[owner] if n else first)
            setattr(self, f"_{name}_length", lengths[owner] if n else lengths)

    def labels(self, starts: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The labels of the windows starting at absolute dataset indices ``starts`` (what :meth:`sample_windows`
        returns; a relative index from ``__iter__`` maps back through the dataset's ``episodes``), each of shape
        (len(starts), chunk_size): ``segment_id``; ``episode_progress``, 0 at an episode's first frame and 1 at
        its last; ``segment_progress``, the same within the frame's segment (1 for a one-frame segment)."""
        starts = np.asarray(starts, dtype=np.int64)
        at = np.searchsorted(self._frames, starts)
        if np.any(at >= len(self._frames)) or np.any(self._frames[np.minimum(at, len(self._frames) - 1)] != starts):
            raise ValueError("labels() takes the absolute dataset index of a window's first frame")
        rows = at[:, None] + np.arange(self.chunk_size)[None, :]
        rows = np.minimum(rows, len(self._frames) - 1)
        out = {"segment_id": self._segment[rows]}
        for name in ("episode", "segment"):
            first, length = getattr(self, f"_{name}_first")[rows], getattr(self, f"_{name}_length")[rows]
            out[f"{name}_progress"] = np.where(length > 1, (rows - first) / np.maximum(length - 1, 1), 1.0
                                               ).astype(np.float32)
        return out

    # -- torch Sampler protocol
    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    def __iter__(self) -> Iterator[int]:
        epoch = self._epoch
        self._epoch += 1  # eagerly, as LeRobot's EpisodeAwareSampler
        return self._iter_epoch(epoch)

    def _iter_epoch(self, epoch: int) -> Iterator[int]:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        left = self.num_samples
        while left:
            n = min(left, _BLOCK)
            _slots, starts = self.index.sample(rng, n, self.weighting)
            if self._to_relative is not None:
                yield from (self._to_relative[s] for s in starts.tolist())
            else:
                yield from starts.tolist()
            left -= n

    # -- helpers
    def sample_windows(self, n: int, rng: np.random.Generator | int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``n`` draws outside torch: (dataset episode index, absolute start index) arrays."""
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        slots, starts = self.index.sample(rng, n, self.weighting)
        return self.episode_of_slot[slots], starts

    def delta_timestamps(self, *keys: str) -> dict[str, list[float]]:
        """``delta_timestamps`` loading this sampler's whole window for each key."""
        return chunk_delta_timestamps(keys, self.chunk_size, self.fps)

    @property
    def total_windows(self) -> int:
        return self.index.total_windows
