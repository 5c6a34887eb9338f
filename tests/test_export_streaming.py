"""Streaming export: episodes are read (one ahead of the writer), written and dropped one at a time, so an
export's memory does not grow with the number of pending episodes; a full dataset disk is refused up front or
cleaned up at once."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

import toy_tasks  # noqa: F401  (registers toy-point)
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage import staging as staging_module
from demoforge.storage.lerobot.export import ExportError, estimate_export_bytes, export_store
from demoforge.storage.lerobot.validate import validate_dataset
from demoforge.storage.store import open_store


def toy(episodes: int) -> JobSpec:
    return JobSpec(task="toy-point", episodes=episodes, task_options={"steps": 12, "size": 32},
                   video=VideoSettings(codec="h264"))


def test_export_holds_at_most_two_staged_episodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, out = tmp_path / "store", tmp_path / "dataset"
    run_job(toy(8), store)
    alive: list[weakref.ref] = []
    most = [0]
    real = staging_module.StagingStore.read_episode

    def counting(self, *args, **kwargs):
        gc.collect()
        most[0] = max(most[0], sum(1 for ref in alive if ref() is not None))  # still held when the next is read
        episode = real(self, *args, **kwargs)
        alive.append(weakref.ref(episode))
        return episode

    monkeypatch.setattr(staging_module.StagingStore, "read_episode", counting)
    report = export_store(store, out)
    assert report.exported == 8 and len(alive) == 8
    # When an episode is read, at most the one being written is still held: every earlier one was dropped.
    assert most[0] <= 1
    assert validate_dataset(out).status == 0


def test_export_refuses_to_start_without_the_space_it_needs(tmp_path: Path, monkeypatch) -> None:
    store, out = tmp_path / "store", tmp_path / "dataset"
    run_job(toy(3), store)
    with open_store(store) as view:
        needed = estimate_export_bytes(view.committed())
    from demoforge.storage import write_errors

    monkeypatch.setattr(write_errors, "free_bytes", lambda _path: needed - 1)  # the disk is not ours to fill
    with pytest.raises(ExportError, match=r"not enough free space to export 3 episode\(s\).*nothing was written"):
        export_store(store, out)
    assert not out.exists() and not any((tmp_path / "dataset.versions").glob("v*"))
