"""Power loss, tested: stores, catalogs and datasets on a file system that forgets what was not fsynced
(tools/powercut_fs.py), and a short power-cut campaign (tools/power_cut.py; the long one is in
docs/reliability.md). No skip: without FUSE these fail (CI runs as root with /dev/fuse).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import toy_tasks  # noqa: F401
from demoforge.pipeline.job import JobSpec, VideoSettings
from helpers import REPO, cli_env, demoforge_argv

sys.path.insert(0, str(REPO / "tools"))

from powercut_fs import PowerCut  # noqa: E402

TOY = JobSpec(task="toy-point", episodes=2, task_options={"steps": 8, "size": 16}, video=VideoSettings(codec="h264"))


def committed_and_verified(store: Path) -> tuple[int, bool]:
    from demoforge.storage.store import open_store

    with open_store(store) as view:
        report = view.verify()
        return len(view.committed()), report.ok


def test_a_generated_store_survives_a_power_cut_right_after_generate_returns(tmp_path):
    """Found by the power-cut campaign: the store folder was never fsynced into its parent (nor staging.zarr
    into the store), so a cut after `generate` said "done" could take every committed episode with it."""
    fs = PowerCut(tmp_path / "disk", tmp_path / "mnt").mount()
    store = fs.mountpoint / "runs" / "toy"  # two new folders: both must be fsynced into their parents
    done = subprocess.run(demoforge_argv("generate", "--task", "toy-point", "--episodes", "2", "--codec", "h264",
                                         "--option", "steps=8", "--option", "size=16", "--store", str(store),
                                         "--json-logs"),
                          env=cli_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    reported = [json.loads(line)["episode"] for line in done.stderr.splitlines()
                if line.startswith("{") and "episode_committed" in line]
    assert len(reported) == 2
    fs.cut()  # before anything else syncs the disk
    assert committed_and_verified(tmp_path / "disk" / "runs" / "toy") == (2, True)


def test_a_published_export_survives_a_power_cut_right_after_export_returns(tmp_path):
    """A dataset in a new folder: the folder, the versions, the link and every file must be durable when the
    export returns (the folder was created without an fsync of its parent before)."""
    from demoforge.pipeline.runner import run_job
    from demoforge.storage.lerobot.file_checksums import verify_dataset
    from demoforge.storage.lerobot.export import export_store
    from demoforge.storage.lerobot.validate import validate_dataset

    run_job(TOY, tmp_path / "disk" / "store")  # on the plain folder, before the mount
    fs = PowerCut(tmp_path / "disk", tmp_path / "mnt").mount()
    report = export_store(fs.mountpoint / "store", fs.mountpoint / "exports" / "toy")
    assert report.version == "v000001"
    fs.cut()
    out = tmp_path / "disk" / "exports" / "toy"
    assert verify_dataset(out).ok
    validated = validate_dataset(out)
    assert validated.status == 0 and validated.episodes == 2


def test_a_catalog_commit_is_durable_as_soon_as_it_returns(tmp_path):
    """The catalog's SQLite settings (WAL, synchronous=FULL): a commit that returned survives the cut that
    follows at once (with synchronous=NORMAL in WAL mode it would not)."""
    from demoforge.storage.catalog import Catalog
    from demoforge.storage.store import open_store

    fs = PowerCut(tmp_path / "disk", tmp_path / "mnt").mount()
    store = open_store(fs.mountpoint / "store", "w", fingerprint=TOY.fingerprint())
    catalog = Catalog(fs.mountpoint / "store")  # a writer's catalog, as the store opens it
    catalog.begin_attempt(0, 0, "ep00000000-a00", seed=7)
    catalog.discard("ep00000000-a00", reason="test", terminal_reason="interrupted", counted=True)
    fs.cut()
    for opened in (catalog, store):
        try:
            opened.close()
        except Exception:  # noqa: BLE001 - the power is off: closing fails with EIO
            pass
    from demoforge.storage.store import open_store

    with open_store(tmp_path / "disk" / "store") as view:
        rows = view.attempts()
    assert [(r.episode_id, r.state.value, r.reason) for r in rows] == [("ep00000000-a00", "discarded", "test")]


@pytest.mark.campaign  # tools/power_cut.py's campaign; the suite keeps the cuts at the moments it found
def test_short_power_cut_campaign(tmp_path):
    report_path = tmp_path / "report.json"
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "tools" / "power_cut.py"), "--trials", "2", "--seed", "1",
                             "--kinds", "generate", "--task", "toy-point", "--episodes", "3",
                             "--modes", "strict,renames", "--out", str(report_path),
                             "--workdir", str(tmp_path / "work")],
                            env=cli_env(HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["violations"] == 0 and report["cuts"] >= 2, result.stdout[-3000:]
    assert "| reported_durable | 0 / " in result.stdout and "| store_verifies | 0 / " in result.stdout
    print(f"short power-cut campaign: {report['cuts']} cuts, {time.monotonic() - started:.0f} s")


def test_a_store_cut_while_its_catalog_is_created_can_always_be_opened_again(tmp_path):
    """Found by the power-cut campaign: the catalog's schema was created one table per transaction, so a cut
    between two left a catalog holding only `meta`, which every later run refused as someone else's SQLite
    file ("holds other tables (meta); refusing to modify it"): the store could never be resumed."""
    from demoforge.storage.store import open_store

    for nth in range(1, 6):  # the first WAL fsyncs of a new store: the schema, then binding the job
        disk, mnt = tmp_path / f"disk{nth}", tmp_path / f"mnt{nth}"
        fs = PowerCut(disk, mnt).mount()
        fs.arm({"ops": ["fsync"], "path": "*/catalog.sqlite-wal", "nth": nth})
        try:
            open_store(mnt / "store", "w", fingerprint=TOY.fingerprint()).close()
        except Exception:  # noqa: BLE001 - the power went off under it
            pass
        fs.cut()
        open_store(disk / "store", "w", fingerprint=TOY.fingerprint()).close()  # opens (and recovers) whatever the cut left
