"""Runaway jobs: a task whose every attempt fails stops `generate` and the daemon with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from demoforge.storage.catalog import Catalog
from helpers import committed_files, daemon_events, run_cli

STEP_ERROR = "joint limit exceeded"  # TOY_POINT_STEP_ERROR: every step of the toy env raises this
GEN = ("generate", "--task", "toy-point", "--codec", "h264", "--max-attempts", "2")


def committed_count(store: Path) -> int:
    catalog = Catalog(store)
    try:
        return len(catalog.committed())
    finally:
        catalog.close()


def test_generate_stops_on_consecutive_abandoned_and_resumes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = run_cli(*GEN, "--episodes", "3", "--store", str(store))
    assert first.returncode == 0, first.stderr
    before = committed_files(store)

    broken = run_cli(*GEN, "--episodes", "10", "--store", str(store), "--max-consecutive-abandoned", "4",
                     TOY_POINT_STEP_ERROR=STEP_ERROR)
    assert broken.returncode == 1, broken.stderr
    assert "Traceback" not in broken.stderr
    assert "the last 4 episodes were all abandoned" in broken.stderr
    assert "joint limit exceeded" in broken.stderr  # the last error and the top reason
    assert "The 3 committed episode(s) are kept" in broken.stderr
    assert committed_files(store) == before

    resumed = run_cli(*GEN, "--episodes", "6", "--store", str(store))
    assert resumed.returncode == 0, resumed.stderr
    assert committed_count(store) == 6
    after = committed_files(store)
    assert {k: after[k] for k in before} == before


def test_negative_limit_is_refused(tmp_path: Path) -> None:
    bad = run_cli(*GEN, "--episodes", "2", "--store", str(tmp_path / "s"), "--max-consecutive-abandoned", "-1")
    assert bad.returncode == 2
    assert "max_consecutive_abandoned must be an integer in [0, 10000000], got -1" in bad.stderr


@pytest.mark.slow
def test_daemon_logs_failing_and_exits_3(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("""
[job]
task = "toy-point"
episodes = "unbounded"
max_attempts = 1
max_consecutive_abandoned = 3
options = { steps = 10, size = 32 }
[video]
codec = "h264"
[store]
dir = "store"
[metrics]
address = "off"
[disk]
min_free_mb = 0
""")
    proc = run_cli("daemon", "--config", str(job), "--json-logs", timeout=120, TOY_POINT_STEP_ERROR=STEP_ERROR)
    assert proc.returncode == 3, proc.stderr
    events = daemon_events(proc.stderr)
    failing = [e for e in events if e["event"] == "failing"]
    assert len(failing) == 1, proc.stderr
    assert failing[0]["consecutive_abandoned"] == 3 and failing[0]["limit"] == 3
    assert any("joint limit exceeded" in reason for reason in failing[0]["top_reasons"])
    assert "joint limit exceeded" in failing[0]["last_error"]
    assert events[-1]["event"] == "stopped" and events[-1]["reason"] == "failing"
