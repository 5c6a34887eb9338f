"""The export child is watched: one that makes no progress is ended after its stacks are dumped (the dataset
keeps its last version; ``generate --export`` exits 1 with the reason; the daemon retries on its schedule), and
one that published but does not exit is ended and its publish counts. Real processes, hung on purpose
(``DEMOFORGE_EXPORT_HANG``, storage/faults.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from demoforge.storage.lerobot.validate import validate_dataset
from helpers import daemon_events, run_cli
from test_daemon import start, wait_for, write_job

pytestmark = pytest.mark.slow
GENERATE = ("generate", "--task", "toy-point", "--episodes", "2", "--codec", "h264", "--option", "steps=8")


def generate_with_hung_export(tmp_path: Path, step: str):
    """``generate --export`` whose export child hangs at ``step``; the watchdog's timeout is 8 s."""
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    result = run_cli(*GENERATE, "--store", str(store), "--export", str(dataset), "--export-timeout", "8",
                     DEMOFORGE_EXPORT_HANG=step)
    return result, store, dataset


def test_generate_export_that_makes_no_progress_is_ended_with_its_stacks(tmp_path: Path) -> None:
    result, store, dataset = generate_with_hung_export(tmp_path, "after_videos")
    assert result.returncode == 1, result.stderr
    assert "the export was ended because it reported no progress for 8 s (last step: after_videos)" in result.stderr
    assert "stays at its last published version and the store is intact" in result.stderr
    stacks = list(store.glob("export-stacks-*.txt"))
    assert len(stacks) == 1 and str(stacks[0]) in result.stderr
    dump = stacks[0].read_text()
    assert "faults.py" in dump and "in pause" in dump and "lerobot/export.py" in dump, dump  # where it hung
    assert not dataset.exists() and not dataset.is_symlink()  # nothing was published
    assert not any(p.is_dir() and not p.name.endswith(".partial") for p in (tmp_path / "dataset.versions").iterdir())


def test_export_that_published_but_does_not_exit_is_ended_and_counts(tmp_path: Path) -> None:
    # It hangs after publishing, before the catalog records the export: ended after the grace period (at most
    # the timeout).
    result, store, dataset = generate_with_hung_export(tmp_path, "before_catalog")
    assert result.returncode == 0, result.stderr
    assert "exported 2 episode(s)" in result.stdout
    assert "it published version v000001 but did not exit within 8 s" in result.stdout
    assert os.readlink(dataset).endswith("v000001") and validate_dataset(dataset).status == 0
    again = run_cli("export", "--store", str(store), "--out", str(dataset), "--json")
    report = json.loads(again.stdout.strip().splitlines()[-1])
    assert (report["exported"], report["reconciled"], report["total_episodes"]) == (0, 2, 2), again.stdout


def test_daemon_ends_a_stalled_export_and_retries_it_on_schedule(tmp_path: Path) -> None:
    job, _port = write_job(tmp_path, every=2, step_sleep=0.02, extra="")
    job.write_text(job.read_text().replace("every_seconds = 600", "every_seconds = 600\nprogress_timeout_seconds = 8"))
    dataset = tmp_path / "dataset"
    proc = start(job, DEMOFORGE_EXPORT_HANG="after_videos", DEMOFORGE_EXPORT_HANG_ONCE=str(tmp_path / "hung-once"))
    try:
        wait_for(lambda: dataset.is_symlink(), timeout=240)  # the retry published
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    log = daemon_events(err)
    stalled = [e for e in log if e["event"] == "export_stalled"]
    assert len(stalled) == 1 and stalled[0]["published"] is False, err
    assert "no progress for 8 s (last step: after_videos)" in stalled[0]["reason"]
    assert "faults.py" in stalled[0]["stacks"] and Path(stalled[0]["stacks_file"]).exists()
    failed = [e for e in log if e["event"] == "export_failed"]
    assert failed and failed[0]["child"].startswith("ended by the watchdog") and "retried" in failed[0]["note"]
    exports = [e for e in log if e["event"] == "export"]
    assert exports and log.index(exports[0]) > log.index(failed[0]), err
    assert validate_dataset(dataset).status == 0
