"""Re-read committed episodes and check them against the catalog: chunk checksums, counts, content hashes,
and (format 3) the stored statistics: covered by the content hash, readable, and (with ``decode``) those of
the numeric arrays recomputed from the staged data and each camera's over LeRobot's frame sample.

An episode that fails is quarantined (never exported) when ``quarantine`` is set; the report says why.
Quarantining writes the catalog: ``Store.verify`` (storage/store.py) runs this through a store opened in
mode ``"r+"`` for that, or ``"r"`` to report only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import av
import numpy as np

from demoforge.storage.catalog import AttemptRow, Catalog
from demoforge.storage.episode_stats import EpisodeStats
from demoforge.storage.lerobot_stats import sample_indices
from demoforge.storage.schema import ANNOTATION_KEYS
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
    pruned: int = 0  # exported episodes whose staged data was pruned: nothing to re-read

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
    try:
        recorded = staged.recorded_stats()
    except StagingCorruptError as exc:
        raise StagingCorruptError(f"episode {row.episode_id}: {exc}") from None
    if decode and recorded is not None:
        _check_stats(row, staged, recorded)
    if decode:
        for camera, data in staged.video.items():
            n = count_frames(data)
            if n != row.frames:
                raise StagingCorruptError(f"episode {row.episode_id}: camera {camera!r} holds {n} frames, "
                                          f"the catalog says {row.frames}")
    return staged


def _check_stats(row: AttemptRow, staged: StagedEpisode, recorded: EpisodeStats) -> None:
    """The stored statistics describe this episode: the numeric arrays' equal those recomputed from its data,
    and each camera's cover LeRobot's frame sample of its length."""
    again = EpisodeStats.compute(staged.state, staged.action, staged.reward, staged.annotations, recorded.cameras)
    differ = recorded.numeric_differences(again)
    if differ:
        raise StagingCorruptError(f"episode {row.episode_id}: its stored statistics of {', '.join(differ)} differ "
                                  "from its data")
    sampled = len(sample_indices(int(row.frames or 0)))
    for camera in staged.video:
        stats = recorded.cameras.get(camera)
        if stats is None or stats.get("count") is None or int(stats["count"][0]) != sampled:
            raise StagingCorruptError(f"episode {row.episode_id}: stored statistics of camera {camera!r} do not "
                                      f"cover the {sampled} frames LeRobot samples of {row.frames}")


def verify_store(catalog: Catalog, staging: StagingStore, *, quarantine: bool = False,
                 decode: bool = True) -> VerifyReport:
    problems: list[EpisodeProblem] = []
    quarantined: list[str] = []
    pruned = catalog.pruned_ids()
    rows = [r for r in catalog.committed() if r.episode_id not in pruned]
    for row in rows:
        try:
            check_episode(staging, row, decode=decode)
        except (StagingCorruptError, av.FFmpegError, IndexError) as exc:
            problems.append(EpisodeProblem(row.episode_id, str(exc)))
            if quarantine:
                catalog.quarantine(row.episode_id, f"verify: {exc}")
                quarantined.append(row.episode_id)
    return VerifyReport(checked=len(rows), problems=problems, quarantined=quarantined,
                        pruned=len(pruned))
