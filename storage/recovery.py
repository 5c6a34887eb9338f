"""Start-up recovery: remove what a dead run left in staging, and say what was removed.

- staging rows (a run died mid-attempt) become ``discarded("interrupted")`` with ``counted = 0``, so the
  attempt is rerun with the same number and seed; their files are deleted;
- staged episode folders that no live catalog row refers to are deleted (a discard that died between the
  catalog flip and the delete, or a folder created before its row);
- zarr ``*.partial`` temp files (a write killed before its rename) are deleted;
- folders of episodes marked pruned that still exist (a prune killed midway) are deleted.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

from demoforge.storage.catalog import Catalog
from demoforge.storage.durable import fsync_dir
from demoforge.storage.schema import AttemptState
from demoforge.storage.paths import EPISODES_DIR
from demoforge.storage.staging import StagingStore


@dataclass(frozen=True)
class RecoveryReport:
    interrupted: list[str] = field(default_factory=list)
    orphan_dirs: list[str] = field(default_factory=list)
    partial_files: list[str] = field(default_factory=list)
    finished_prunes: list[str] = field(default_factory=list)

    @property
    def cleaned(self) -> int:
        return len(self.interrupted) + len(self.orphan_dirs) + len(self.partial_files) + len(self.finished_prunes)

    def describe(self) -> str:
        if not self.cleaned:
            return "recovery: nothing to clean"
        return (f"recovery: discarded {len(self.interrupted)} interrupted attempt(s), removed "
                f"{len(self.orphan_dirs)} orphan folder(s) and {len(self.partial_files)} temp file(s)"
                + (f"; finished pruning {len(self.finished_prunes)} episode(s)" if self.finished_prunes else ""))


def recover(catalog: Catalog, staging: StagingStore) -> RecoveryReport:
    report = RecoveryReport()
    for row in catalog.attempts((AttemptState.STAGING,)):
        catalog.discard(row.episode_id, reason="interrupted: the run died before this attempt ended",
                        terminal_reason="interrupted", counted=False)
        staging.delete_episode(row.episode_id)
        catalog.log_recovery("discard_interrupted", row.episode_id)
        report.interrupted.append(row.episode_id)
    live = catalog.referenced_episode_ids()
    for episode_id in staging.episode_ids():
        if episode_id not in live:
            shutil.rmtree(staging.episode_path(episode_id))
            catalog.log_recovery("remove_orphan", episode_id)
            report.orphan_dirs.append(episode_id)
    for path in list(staging.iter_partial_files()):
        path.unlink(missing_ok=True)
        catalog.log_recovery("remove_partial", str(path.relative_to(staging.path)))
        report.partial_files.append(str(path.relative_to(staging.path)))
    if report.orphan_dirs:
        fsync_dir(staging.path / EPISODES_DIR)
    from demoforge.storage.prune import finish_prunes

    for episode_id in finish_prunes(catalog, staging):
        catalog.log_recovery("finish_prune", episode_id)
        report.finished_prunes.append(episode_id)
    return report


def release_unfinished(catalog: Catalog, staging: StagingStore) -> list[str]:
    """Delete the files of attempts still ``staging`` when a run ends with an error (a full disk, most often),
    so the space is given back at once rather than at the next start. Their rows stay ``staging``: the next
    run's recovery discards them (a staging row without files is what a crash before the first write leaves).
    Call only once every stage has stopped. Best effort: a failure here must not hide the original error."""
    released: list[str] = []
    try:
        for row in catalog.attempts((AttemptState.STAGING,)):
            if staging.delete_episode(row.episode_id):
                released.append(row.episode_id)
    except Exception:  # noqa: BLE001 - the run's own error is what the user must see
        pass
    return released
