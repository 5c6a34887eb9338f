"""Delete the staged data of episodes the dataset already holds (``demoforge prune --exported``).

A store keeps every staged episode next to its exported copy: twice the disk. Pruning removes the staged
folder of each ``exported`` episode and keeps its catalog row (state, frame count, content hash, dataset
index), flagged in the catalog's ``pruned`` table.

Crash safety: one transaction marks every episode to prune, then the folders are deleted one by one. A kill
in between leaves marked episodes whose folders (or part of them) still exist; readers already treat them as
pruned, and the next prune or the next writer's recovery (:func:`finish_prunes`) deletes what is left.
Export never needs a pruned episode again: it exports committed episodes the dataset does not hold, and a
pruned one is in the dataset by definition (an export into another dataset reports it as unavailable).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from demoforge.storage.catalog import Catalog
from demoforge.storage.durable import fsync_dir
from demoforge.storage.faults import prune_pause
from demoforge.storage.paths import EPISODES_DIR
from demoforge.storage.staging import StagingStore



@dataclass(frozen=True)
class PruneReport:
    pruned: int  # episodes whose staged data was deleted by this call
    finished: int  # episodes an interrupted prune had marked, completed now
    freed_bytes: int
    kept_committed: int  # committed, not yet exported: kept


def _folder_bytes(path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def finish_prunes(catalog: Catalog, staging: StagingStore) -> list[str]:
    """Delete the folders of episodes marked pruned that still exist (a prune killed midway)."""
    done = []
    for episode_id in sorted(catalog.pruned_ids()):
        path = staging.episode_path(episode_id)
        if path.exists():
            shutil.rmtree(path)
            done.append(episode_id)
    if done:
        fsync_dir(staging.path / EPISODES_DIR)
    return done


def prune_exported(catalog: Catalog, staging: StagingStore,
                   progress: Callable[[int, int], None] | None = None) -> PruneReport:
    """Prune every exported episode's staged data. The caller holds the store's writer lock (or is the
    writer: the daemon after an export)."""
    pause = prune_pause()  # tests: a kill lands between two deletions
    already = catalog.pruned_ids()
    finished = [e for e in sorted(already) if staging.episode_path(e).exists()]
    todo = [r.episode_id for r in catalog.attempts(("exported",)) if r.episode_id not in already]
    if todo:
        catalog.mark_pruned(todo)  # first: a crash after this is finished later, never half-visible
    freed = 0
    targets = finished + todo
    for done, episode_id in enumerate(targets, start=1):
        path = staging.episode_path(episode_id)
        if path.exists():
            freed += _folder_bytes(path)
            shutil.rmtree(path)
        if pause:
            time.sleep(pause)
        if progress is not None:
            progress(done, len(targets))
    if targets:
        fsync_dir(staging.path / EPISODES_DIR)
    kept = len(catalog.attempts(("committed",)))
    return PruneReport(pruned=len(todo), finished=len(finished), freed_bytes=freed, kept_committed=kept)
