"""``demoforge verify DATASET``: re-read every file of a published dataset version against the checksums its
export recorded (``files`` in ``meta/demoforge.json``), and decode a sample of frames of every video file.

Reports each changed (size or sha256 differs), missing or extra file by its path, and each video file whose
sampled frames do not decode. The marker itself cannot list its own checksum: it is checked by being read
(a damaged one fails to parse and is reported as such).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from demoforge.storage.lerobot.format import MARKER, file_checksum
from demoforge.storage.lerobot.publish import ExportError, resolve_target

SAMPLE_FRAMES = 3  # per video file: its first, middle and last frame


@dataclass(frozen=True)
class FileProblem:
    path: str  # relative to the dataset version
    problem: str  # changed, missing, extra, does not decode


@dataclass(frozen=True)
class DatasetVerifyReport:
    dataset: Path
    version: str
    checked: int  # files compared against their recorded checksum
    decoded_frames: int
    problems: list[FileProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(out: Path | str, *, sample_frames: int = SAMPLE_FRAMES) -> DatasetVerifyReport:
    from demoforge.storage.video import count_frames, decode_indices

    out = Path(out)
    target = resolve_target(out)  # NotOurDatasetError for a dataset demoforge did not write, or a broken marker
    if target.current is None or target.marker is None:
        raise ExportError(f"{out} holds no published dataset version (nothing was exported there)")
    current, marker = target.current, target.marker
    problems: list[FileProblem] = []
    if not marker.files:
        problems.append(FileProblem(MARKER, "records no file checksums (published before they were recorded); "
                                            "the next export records them"))
    for rel, recorded in sorted(marker.files.items()):
        path = current / rel
        if not path.is_file():
            problems.append(FileProblem(rel, "missing"))
            continue
        actual = file_checksum(path)
        if actual != recorded:
            what = (f"size {actual.size} bytes, recorded {recorded.size}" if actual.size != recorded.size
                    else "sha256 differs from the one recorded at export")
            problems.append(FileProblem(rel, f"changed: {what}"))
    for dirpath, _dirs, names in os.walk(current):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(current).as_posix()
            if rel != MARKER and rel not in marker.files and marker.files:
                problems.append(FileProblem(rel, "extra: not part of the published version"))
    decoded = 0
    for rel in sorted(r for r in marker.files if r.startswith("videos/") and r.endswith(".mp4")):
        path = current / rel
        if not path.is_file():
            continue
        try:
            n = count_frames(path)
            wanted = sorted({0, n // 2, n - 1}) if n else []
            got = decode_indices(path, wanted[:sample_frames])
            if len(got) != len(wanted[:sample_frames]):
                raise ValueError(f"decoded {len(got)} of the {len(wanted)} sampled frames")
            decoded += len(got)
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the finding
            problems.append(FileProblem(rel, f"does not decode: {type(exc).__name__}: {exc}"))
    return DatasetVerifyReport(out, current.name, len(marker.files), decoded, problems)
