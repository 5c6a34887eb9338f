"""The daemon exports in a child process: a killed (crashed, OOM-killed) export child leaves the daemon
generating, is logged, is retried at the next export moment, and the dataset keeps its last version."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from demoforge.storage.lerobot.validate import validate_dataset
from helpers import daemon_events
from test_daemon import committed, scrape, start, wait_for, write_job

pytestmark = pytest.mark.slow


def export_children(parent: int) -> list[int]:
    """Pids of ``demoforge export`` processes whose parent is ``parent`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"export" in cmdline:
            found.append(int(entry.name))
    return found


def published_version(dataset: Path) -> str:
    return os.readlink(dataset).rsplit("/", 1)[-1]


def test_killed_export_child_is_logged_retried_and_generation_goes_on(tmp_path: Path) -> None:
    job, port = write_job(tmp_path, every=3, step_sleep=0.02)
    dataset = tmp_path / "dataset"
    # Each export step sleeps 0.5 s, so the child is alive long enough to be killed mid-export.
    proc = start(job, DEMOFORGE_EXPORT_PAUSE="0.5")
    try:
        wait_for(lambda: dataset.is_symlink())  # the first export published
        first = published_version(dataset)
        # Its child may still be finishing (catalog, report): a kill now would come after its publish, which
        # counts. Kill the next export's child, found as it starts (seconds of imports before it publishes).
        publisher = set(export_children(proc.pid))
        child = wait_for(lambda: [c for c in export_children(proc.pid) if c not in publisher], timeout=120,
                         every=0.05)[0]
        os.kill(child, signal.SIGKILL)  # what the OOM killer does
        killed_at = scrape(port)["demoforge_episodes_committed_total"]
        assert published_version(dataset) == first  # the dataset kept its last published version
        wait_for(lambda: scrape(port)["demoforge_export_failures_total"] >= 1)
        # The daemon keeps generating, and a later export succeeds.
        wait_for(lambda: scrape(port)["demoforge_episodes_committed_total"] >= killed_at + 3)
        wait_for(lambda: published_version(dataset) != first, timeout=180)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    log = daemon_events(err)
    failed = [e for e in log if e["event"] == "export_failed"]
    assert failed and failed[0]["child"] == "killed by SIGKILL", err
    assert "last published version" in failed[0]["note"]
    after = [e for e in log[log.index(failed[0]):] if e["event"] == "export"]
    assert after, "an export after the failure should have succeeded"
    assert not list((tmp_path / "dataset.versions").glob("*.partial"))
    rows, _staging = committed(tmp_path / "store")
    report = validate_dataset(dataset)
    assert report.status == 0 and report.episodes == len(rows)


def test_export_child_dies_with_its_parent(tmp_path: Path) -> None:
    """A SIGKILLed daemon must not leave an export running: it would hold the dataset's export lock."""
    import subprocess
    import sys

    from helpers import cli_env, run_cli

    store = tmp_path / "store"
    assert run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "2",
                   "--store", str(store)).returncode == 0
    # A stand-in parent that starts an export child the way the daemon does, then is killed.
    parent = subprocess.Popen([sys.executable, "-c", (
        "import anyio, sys; from pathlib import Path; from demoforge.pipeline.export_child import export_in_child;"
        f"anyio.run(export_in_child, Path({str(store)!r}), Path({str(tmp_path / 'dataset')!r}))")],
        env=cli_env(DEMOFORGE_EXPORT_PAUSE="5"))
    child = wait_for(lambda: export_children(parent.pid), timeout=120)[0]
    parent.kill()
    parent.wait()
    wait_for(lambda: not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
             .rsplit(")", 1)[1].split()[0], timeout=30)
    again = run_cli("export", "--store", str(store), "--out", str(tmp_path / "dataset"))
    assert again.returncode == 0 and "exported 2 episode(s)" in again.stdout, again.stderr


def test_export_waits_while_the_dataset_disk_is_below_the_floor(tmp_path: Path) -> None:
    job, port = write_job(tmp_path, every=1)
    job.write_text(job.read_text().replace("min_free_mb = 1", "min_free_mb = 500"))
    free = tmp_path / "free_mb"
    free.write_text("100")  # below the floor from the start: no generation, and no export
    proc = start(job, DEMOFORGE_FREE_SPACE_FILE=str(free))
    try:
        wait_for(lambda: scrape(port)["demoforge_generation_paused"] == 1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    deferred = [e for e in daemon_events(err) if e["event"] == "export_deferred"]
    assert deferred and deferred[-1]["why"] == "final" and deferred[-1]["floor_mb"] == 500, err
    assert not (tmp_path / "dataset").exists()  # nothing was written on the full disk
