"""Re-read committed episodes and check them against the catalog: chunk checksums, counts, content hashes.

An episode that fails is quarantined (never exported) when ``quarantine`` is set; the report says why.
Quarantining writes the catalog: open the store with ``open_store_updater`` for that, or
``open_store_reader`` to report only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import av
import numpy as np

from demoforge.pipeline.contract import ANNOTATION_KEYS
from demoforge.storage.catalog import AttemptRow, Catalog
from demoforge.storage.staging import StagedEpisode, StagingCorruptError, StagingStore
from demoforge.storage.video import count_frames


@dataclass(frozen=True)
class EpisodeProblem:
    episode_id: str
    problem: str


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    problems: list[EpisodeProblem] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_episode(staging: StagingStore, row: AttemptRow, *, decode: bool = True) -> StagedEpisode:
    """Read one committed episode back and raise :class:`StagingCorruptError` on any disagreement."""
    if row.frames is None or row.content_hash is None:
        raise StagingCorruptError(f"episode {row.episode_id}: catalog row has no frame count or hash")
    staged = staging.read_episode(row.episode_id, row.frames, row.video_bytes)
    if staged.content_hash() != row.content_hash:
        raise StagingCorruptError(f"episode {row.episode_id}: content hash differs from the one recorded at commit")
    annotations = staged.annotations
    if annotations.shape != (row.frames, len(ANNOTATION_KEYS)) or not np.array_equal(
            annotations[:, ANNOTATION_KEYS.index("episode_step")], np.arange(row.frames)):
        raise StagingCorruptError(f"episode {row.episode_id}: annotations do not count 0..{row.frames - 1}")
    if decode:
        for camera, data in staged.video.items():
            n = count_frames(data)
            if n != row.frames:
                raise StagingCorruptError(f"episode {row.episode_id}: camera {camera!r} holds {n} frames, "
                                          f"the catalog says {row.frames}")
    return staged


def verify_store(catalog: Catalog, staging: StagingStore, *, quarantine: bool = False,
                 decode: bool = True) -> VerifyReport:
    problems: list[EpisodeProblem] = []
    quarantined: list[str] = []
    rows = catalog.committed()
    for row in rows:
        try:
            check_episode(staging, row, decode=decode)
        except (StagingCorruptError, av.FFmpegError, IndexError) as exc:
            problems.append(EpisodeProblem(row.episode_id, str(exc)))
            if quarantine:
                catalog.quarantine(row.episode_id, f"verify: {exc}")
                quarantined.append(row.episode_id)
    return VerifyReport(checked=len(rows), problems=problems, quarantined=quarantined)
