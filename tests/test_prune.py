"""`demoforge prune --exported`: the staged data of exported episodes goes, the catalog rows stay, a kill
midway is finished later, and status, verify and export treat pruned episodes correctly."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from demoforge.storage.catalog import Catalog
from demoforge.storage.lerobot.validate import validate_dataset
from helpers import cli_env, daemon_events, demoforge_argv, run_cli

GEN = ("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8")


def staged(store: Path) -> set[str]:
    return {p.name for p in (store / "staging.zarr" / "episodes").iterdir() if p.is_dir()}


def rows(store: Path) -> dict[str, str]:
    catalog = Catalog(store)
    try:
        return {r.episode_id: r.state for r in catalog.attempts(("committed", "exported"))}
    finally:
        catalog.close()


def test_prune_exported_then_status_verify_export_and_resume(tmp_path: Path) -> None:
    store, dataset, other = tmp_path / "store", tmp_path / "dataset", tmp_path / "other"
    assert run_cli(*GEN, "--episodes", "4", "--store", str(store), "--export", str(dataset)).returncode == 0
    assert run_cli(*GEN, "--episodes", "6", "--store", str(store)).returncode == 0  # 2 committed, not exported
    before = rows(store)
    refused = run_cli("prune", "--store", str(store))
    assert refused.returncode == 2 and "--exported" in refused.stderr

    pruned = run_cli("prune", "--store", str(store), "--exported")
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned the staged data of 4 exported episode(s)" in pruned.stdout
    assert "2 committed episode(s) not yet exported were kept" in pruned.stdout
    assert rows(store) == before  # rows, states kept
    assert staged(store) == {e for e, s in before.items() if s == "committed"}

    status = run_cli("status", "--store", str(store), "--json")
    assert json.loads(status.stdout)["pruned"] == 4
    verify = run_cli("verify", "--store", str(store))
    assert verify.returncode == 0 and "verified 2 committed episode(s)" in verify.stdout, verify.stdout
    assert "4 pruned after export" in verify.stdout
    # The same dataset gets the 2 new ones; the pruned ones are never needed again.
    export = run_cli("export", "--store", str(store), "--out", str(dataset))
    assert export.returncode == 0 and "exported 2 episode(s)" in export.stdout, export.stderr
    assert "holds 6 episode(s)" in export.stdout
    # Another dataset cannot get pruned episodes: said plainly, nothing quarantined.
    elsewhere = run_cli("export", "--store", str(store), "--out", str(other))
    assert elsewhere.returncode == 0 and "4 episode(s) are not in" in elsewhere.stdout, elsewhere.stdout
    assert set(rows(store).values()) == {"exported"}
    again = run_cli("prune", "--store", str(store), "--exported")
    assert "pruned the staged data of 2 exported episode(s)" in again.stdout
    assert not staged(store)
    resumed = run_cli(*GEN, "--episodes", "8", "--store", str(store))  # generation resumes normally
    assert resumed.returncode == 0, resumed.stderr
    assert len(rows(store)) == 8 and len(staged(store)) == 2
    check = validate_dataset(dataset)  # in process: the validate command itself is tested in test_export.py
    assert check.status == 0 and check.episodes == 6, check.to_json()


def test_prune_killed_midway_is_finished_by_the_next_prune_or_writer(tmp_path: Path) -> None:
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    assert run_cli(*GEN, "--episodes", "5", "--store", str(store), "--export", str(dataset)).returncode == 0
    proc = subprocess.Popen(demoforge_argv("prune", "--store", str(store), "--exported"),
                            env=cli_env(DEMOFORGE_PRUNE_PAUSE="1.0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a loaded machine can take long to start the process
    while len(staged(store)) > 3 and time.monotonic() < deadline:  # killed after the first deletions
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = staged(store)
    assert 0 < len(left) < 5, left
    # Readers already treat every marked episode as pruned.
    verify = run_cli("verify", "--store", str(store))
    assert verify.returncode == 0 and "5 pruned after export" in verify.stdout, verify.stdout
    # A writer's start-up recovery finishes the prune (a re-run of prune would too).
    resumed = run_cli(*GEN, "--episodes", "6", "--store", str(store))
    assert resumed.returncode == 0, resumed.stderr
    assert "finished pruning" in resumed.stdout
    assert staged(store) == {e for e, s in rows(store).items() if s == "committed"}
    export = run_cli("export", "--store", str(store), "--out", str(dataset))
    assert export.returncode == 0 and "holds 6 episode(s)" in export.stdout, export.stdout


def test_daemon_prunes_after_each_export(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("""
[job]
task = "toy-point"
episodes = 6
options = { steps = 8, size = 32 }
[video]
codec = "h264"
[store]
dir = "store"
[export]
dir = "dataset"
every_episodes = 3
prune = true
[metrics]
address = "off"
[disk]
min_free_mb = 0
""")
    proc = run_cli("daemon", "--config", str(job), "--json-logs", timeout=600)
    assert proc.returncode == 0, proc.stderr
    events = daemon_events(proc.stderr)
    assert any(e["event"] == "pruned" and e["episodes"] > 0 for e in events), proc.stderr
    store = tmp_path / "store"
    assert set(rows(store).values()) == {"exported"} and len(rows(store)) == 6
    assert not staged(store)  # the final export's episodes were pruned too
    check = validate_dataset(tmp_path / "dataset")
    assert check.status == 0 and check.episodes == 6, check.to_json()
