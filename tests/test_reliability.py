"""Reliability: a short SIGKILL campaign over generate / export / daemon (tools/crash_campaign.py), and hostile
input (names that try to escape directories, NUL bytes, very long names, huge sizes, things that are not
stores or datasets): refused with a clear message and the documented exit code, no traceback, nothing written.

Malformed daemon job files are covered by tests/test_daemon.py (test_invalid_job_files_are_refused_naming_the_key,
test_invalid_job_file_exits_2_naming_the_key); a dataset folder that is not ours by tests/test_export.py
(test_foreign_and_mismatched_targets_are_refused_untouched).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import toy_tasks  # noqa: F401
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.tasks.registry import (
    CameraSpec,
    TaskDefinitionError,
    TaskEntry,
    TaskInfo,
    check_task_info,
)
from helpers import REPO, TESTS, cli_env, demoforge_argv, kill_at_step

pytestmark = pytest.mark.slow

LONG = "y" * 5000
COMPONENT = "z" * 300
TOY = ("--task", "toy-point", "--episodes", "1", "--codec", "h264")


def snapshot(root: Path, allow: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every path under ``root`` with a digest of its content ('dir' for folders), except under ``allow``."""
    out = {}
    for p in sorted(root.rglob("*")):
        if any(p == a or a in p.parents for a in allow):
            continue
        out[str(p.relative_to(root))] = "dir" if p.is_dir() and not p.is_symlink() else \
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else f"-> {os.readlink(p)}"
    return out


def refused(cwd: Path, *args: str, code: int = 2, match: str = "", watch: Path | None = None,
            allow: tuple[Path, ...] = (), short: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in ``cwd``; assert the exit code, the message and no traceback, and that nothing changed
    under ``watch`` (default ``cwd``) except inside ``allow`` (a store the command may legitimately open).
    ``short``: the message must not repeat a hostile name at full length."""
    watch = watch or cwd
    before = snapshot(watch, allow)
    result = subprocess.run(demoforge_argv(*args), env=cli_env(**(env or {})), capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL, cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == code, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    assert match in output, output[-2000:]
    if short:
        assert len(output) < 2000, output[:500]
    assert snapshot(watch, allow) == before, "something was written outside the store/dataset"
    return result


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A working directory two levels down, so '../..' escapes still land inside the watched tree."""
    cwd = tmp_path / "watched" / "a" / "b"
    cwd.mkdir(parents=True)
    return cwd


def make_store(path: Path) -> None:
    """A real store bound to the toy job, with no episodes (instant; export and verify need a fingerprint)."""
    from demoforge.storage.store import open_store

    open_store(path, "w", fingerprint=JobSpec(task="toy-point", episodes=1,
                                              video=VideoSettings(codec="h264")).fingerprint()).close()


# ------------------------------------------------------------------------------------- crash campaign
@pytest.mark.campaign
def test_short_crash_campaign(tmp_path):
    report_path = tmp_path / "report.json"
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "tools" / "crash_campaign.py"), "--trials", "3", "--seed", "1", "--episodes", "4",
                             "--out", str(report_path), "--workdir", str(tmp_path / "work")],
                            env=cli_env(HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["violations"] == 0 and report["kills"] >= 3, result.stdout[-3000:]
    assert {t["kind"] for t in report["trials"]} == {"generate", "export", "daemon"}
    assert "| committed_kept | 0 / 1 | 0 / 1 | 0 / 1 |" in result.stdout
    print(f"short campaign: {time.monotonic() - started:.0f} s")


def test_export_killed_between_rename_and_link_swap_is_completed_by_the_next_one(tmp_path):
    """Found by the long crash campaign: a version renamed into place but never published blocked every later
    export (the rename of the same version number failed with ENOTEMPTY)."""
    from demoforge.pipeline.runner import run_job
    from demoforge.storage.lerobot.export import export_store
    from demoforge.storage.lerobot.validate import validate_dataset

    store, out = tmp_path / "store", tmp_path / "dataset"
    versions = tmp_path / "dataset.versions"
    for episodes, version in ((1, "v000001"), (2, "v000002")):
        run_job(JobSpec(task="toy-point", episodes=episodes, task_options={"steps": 12, "size": 16},
                        video=VideoSettings(codec="h264")), store)
        # A real `demoforge export` SIGKILLed after the rename and before the link swap (its hook's moment).
        kill_at_step(demoforge_argv("export", "--store", str(store), "--out", str(out)), "before_publish",
                     tmp_path / f"renamed-{version}")
        assert (versions / version).is_dir()
        assert not out.is_symlink() or os.readlink(out) != f"dataset.versions/{version}"
        report = export_store(store, out)
        assert (report.total_episodes, report.version) == (episodes, version)
        assert os.readlink(out) == f"dataset.versions/{version}"
    assert validate_dataset(out).status == 0


# ------------------------------------------------------------------------------------- task definitions
def info(**kw) -> TaskInfo:
    base = dict(name="t", description="", instruction="", fps=10, action_shape=(1,),
                state_shapes={"observation.state": (2,)}, cameras=(CameraSpec("cam", 32, 32),),
                segment_names=("a",))
    return TaskInfo(**{**base, **kw})


@pytest.mark.parametrize("bad", ["../x", "a/b", "/abs", "..", ".hidden", "", "x" * 65, "a\x00b", "ok..no", "a b",
                                 "é"])
def test_unsafe_camera_and_feature_names_are_refused(bad):
    with pytest.raises(TaskDefinitionError, match="camera name") as caught:
        check_task_info(info(cameras=(CameraSpec(bad, 32, 32),)))
    assert repr(bad) in str(caught.value)
    with pytest.raises(TaskDefinitionError, match="state feature name"):
        check_task_info(info(state_shapes={bad: (2,)}))


@pytest.mark.parametrize("kw, message", [
    ({"cameras": (CameraSpec("cam", 100_000_000, 100_000_000),)}, "job limit"),
    ({"cameras": (CameraSpec("cam", 0, 32),)}, "job limit"),
    ({"cameras": (CameraSpec("cam", 32, 32), CameraSpec("cam", 32, 32))}, "declared twice"),
    ({"state_shapes": {"observation.state": (100_000, 100_000)}}, "at most"),
    ({"action_shape": (0,)}, "positive"),
    ({"fps": 0}, "fps"),
])
def test_oversized_task_descriptions_are_refused(kw, message):
    with pytest.raises(TaskDefinitionError, match=message):
        check_task_info(info(**kw))


@pytest.mark.parametrize("name", ["wrist_cam.left-1", "_cam", "9", "a" * 64, "cam.v2", "UPPER_case"])
def test_safe_names_pass(name):
    described = info(cameras=(CameraSpec(name, 32, 32),), state_shapes={"observation.state": (2,), name: (3,)})
    assert check_task_info(described) is described  # accepted as declared, nothing renamed or dropped


def test_a_task_declaring_an_unsafe_camera_is_refused_before_anything_is_built(tmp_path):
    built: list[Mapping[str, Any]] = []

    def make_env(options: Mapping[str, Any]) -> gym.Env:
        built.append(options)
        raise AssertionError("a task refused by its description must not be built")

    entry = TaskEntry(name="toy-evil-api", defaults={}, describe=lambda o: info(name="toy-evil-api",
                                                                               cameras=(CameraSpec("../x", 8, 8),)),
                      make_env=make_env)
    with pytest.raises(TaskDefinitionError, match=r"task 'toy-evil-api': camera name '\.\./x'"):
        entry.info()
    with pytest.raises(TaskDefinitionError):
        entry.build()
    assert not built


EVIL_TASKS = '''
from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, TaskInfo, register
import toy_tasks

def _info(options):
    return TaskInfo(name="toy-evil", description="escapes", instruction="", fps=10, action_shape=(1,),
                    state_shapes={"observation.state": (2,)}, cameras=(CameraSpec("../x", 32, 32),),
                    segment_names=("approach", "retreat"), options=options)

register(TaskEntry(name="toy-evil", defaults=toy_tasks.DEFAULTS, describe=_info,
                   make_env=lambda o: toy_tasks.CameraPointEnv(dict(o))))
'''


def test_registered_task_with_camera_dot_dot_is_refused_by_the_cli(tmp_path, work):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "evil_tasks.py").write_text(EVIL_TASKS)
    env = {"DEMOFORGE_TASK_MODULES": "toy_tasks,evil_tasks", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(plugins)])}
    watched = work.parent.parent
    refused(work, "generate", "--task", "toy-evil", "--episodes", "1", "--codec", "h264", "--store", "store",
            match="camera name '../x' is not allowed", watch=watched, env=env)
    refused(work, "run", "--task", "toy-evil", "--episodes", "1", match="camera name '../x'", watch=watched, env=env)
    job = work / "job.toml"
    job.write_text('[job]\ntask = "toy-evil"\nepisodes = 1\n[store]\ndir = "store"\n[metrics]\naddress = "off"\n')
    refused(work, "daemon", "--config", str(job), match="camera name '../x'", watch=watched, env=env)


# ------------------------------------------------------------------------------------- generate
@pytest.mark.parametrize("task", ["../../etc", "/etc/passwd", "toy-point/../../x", "x" * 5000])
def test_generate_with_a_path_like_task_name_is_refused(work, task):
    refused(work, "generate", "--task", task, "--episodes", "1", "--store", "store", match="unknown task",
            watch=work.parent.parent)


def test_huge_requested_sizes_are_refused_before_allocating(work):
    # Refused by the size checks (exit 2 naming the limit, no traceback, nothing written): an allocation of
    # 100000000^2 pixels would have ended in a MemoryError traceback instead.
    # the toy task has no option check of its own: the job limits refuse it
    refused(work, "generate", *TOY, "--option", "size=100000000", "--store", "store",
            match="the job limit is 1..4096 pixels a side")
    refused(work, "run", "--task", "toy-point", "--episodes", "1", "--option", "size=100000000", match="job limit")
    # fetch-pick-place's own option check
    refused(work, "generate", "--task", "fetch-pick-place", "--episodes", "1", "--option", "image_size=100000000",
            "--store", "store", match="must be in 32..1024")
    refused(work, "generate", *TOY[:2], "--episodes", "100000000", "--store", "store", match="episodes must be")


def test_store_paths_that_are_too_long_are_refused_without_creating_parents(work):
    refused(work, "generate", *TOY, "--store", LONG, match="the limit is 4095", watch=work.parent.parent,
            short=True)
    refused(work, "generate", *TOY, "--store", f"new/{COMPONENT}/store", match="component of 300 bytes",
            watch=work.parent.parent, short=True)
    for command in ("status", "verify"):
        refused(work, command, "--store", LONG, match="is not a demoforge store", watch=work.parent.parent,
                short=True)


def test_generate_into_a_non_empty_folder_that_is_not_a_store_is_refused(work):
    photos = work / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(b"meow")
    refused(work, "generate", *TOY, "--store", "photos", match="non-empty directory that is not a demoforge store")


def test_nul_bytes_in_paths_are_refused(tmp_path, work):
    """argv cannot carry a NUL byte (exec refuses it); a job file and the Python API can."""
    from demoforge.pipeline.runner import run_job
    from demoforge.storage.lerobot.export import ExportError, export_store
    from demoforge.storage.store import StoreError

    job = work / "job.toml"
    job.write_text('[job]\ntask = "toy-point"\n[store]\ndir = "st\\u0000ore"\n[metrics]\naddress = "off"\n')
    refused(work, "daemon", "--config", str(job), match="NUL byte")
    job.write_text('[job]\ntask = "toy-point"\n[store]\ndir = "store"\n[export]\ndir = "d\\u0000s"\n'
                   '[metrics]\naddress = "off"\n')
    refused(work, "daemon", "--config", str(job), match="NUL byte")
    before = snapshot(tmp_path)
    with pytest.raises(StoreError, match="NUL byte"):
        run_job(JobSpec(task="toy-point", episodes=1, video=VideoSettings(codec="h264")), tmp_path / "st\x00ore")
    assert snapshot(tmp_path) == before
    store = tmp_path / "store"
    make_store(store)
    before = snapshot(tmp_path, (store,))
    with pytest.raises(ExportError, match="NUL byte"):
        export_store(store, tmp_path / "data\x00set")
    assert snapshot(tmp_path, (store,)) == before


# ------------------------------------------------------------------------------------- export
def test_export_out_paths_that_are_too_long_or_odd_are_refused(tmp_path, work):
    store = work / "store"
    make_store(store)
    watched = work.parent.parent
    refused(work, "export", "--store", "store", "--out", LONG, match="the limit is 4095", watch=watched,
            allow=(store,), short=True)
    refused(work, "export", "--store", "store", "--out", f"new/{COMPONENT}/ds", match="component of 300 bytes",
            watch=watched, allow=(store,), short=True)
    # NAME.versions must fit too
    refused(work, "export", "--store", "store", "--out", "d" * 250, match="longer than 246 bytes", watch=watched,
            allow=(store,))
    (work / "afile").write_text("x")
    refused(work, "export", "--store", "store", "--out", "afile/ds", match="cannot", watch=watched, allow=(store,))


# ------------------------------------------------------------------------------------- validate / verify
def test_validate_on_a_folder_that_is_not_a_dataset(work):
    folder = work / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    result = refused(work, "validate", "notes", match="CANNOT LOAD")
    assert "cannot load" in result.stdout
    refused(work, "validate", "missing", match="CANNOT LOAD")
    refused(work, "validate", LONG, match="CANNOT LOAD")
    refused(work, "inspect", LONG, match="File name too long")


def test_verify_and_status_on_things_that_are_not_stores(work):
    empty = work / "empty"
    empty.mkdir()
    garbage = work / "garbage"
    garbage.mkdir()
    (garbage / "catalog.sqlite").write_bytes(b"not a database at all, " * 20)
    foreign = work / "foreign"
    foreign.mkdir()
    db = sqlite3.connect(foreign / "catalog.sqlite")
    db.execute("CREATE TABLE photos (name TEXT)")
    db.commit()
    db.close()
    (work / "afile").write_text("x")
    refused(work, "verify", "--store", "empty", match="no catalog.sqlite")
    refused(work, "verify", "--store", "afile", match="is not a demoforge store")
    for command in ("verify", "status"):
        refused(work, command, "--store", "garbage", match="is not an SQLite database")
        refused(work, command, "--store", "foreign", match="holds other tables (photos)")
    refused(work, "export", "--store", "foreign", "--out", "ds", match="holds other tables (photos)")
    refused(work, "generate", *TOY, "--store", "garbage", match="is not an SQLite database")


def test_tampered_catalog_cannot_lead_outside_the_store(tmp_path, work):
    """Names read back from a catalog become paths: an unsafe camera or episode id is refused, never followed."""
    watched = work.parent.parent
    victim = watched / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    store = work / "store"
    make_store(store)
    db = sqlite3.connect(store / "catalog.sqlite")
    db.execute("INSERT INTO attempts (episode_index, attempt, episode_id, state, seed, created_at, updated_at) "
               "VALUES (0, 0, '../../../../../victim', 'staging', 1, 0, 0)")
    db.commit()
    db.close()
    refused(work, "generate", *TOY, "--store", "store", match="unsafe episode id", watch=watched, allow=(store,))
    assert (victim / "precious.txt").read_text() == "keep me"
    bad = work / "bad-fingerprint"
    make_store(bad)
    db = sqlite3.connect(bad / "catalog.sqlite")
    fingerprint = json.loads(db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()[0])
    fingerprint["cameras"] = [["../../../victim", 32, 32]]
    db.execute("UPDATE meta SET value = ? WHERE key = 'fingerprint'", (json.dumps(fingerprint),))
    db.commit()
    db.close()
    refused(work, "verify", "--store", "bad-fingerprint", match="unsafe", watch=watched, allow=(bad,))
    refused(work, "export", "--store", "bad-fingerprint", "--out", "ds", match="unsafe", watch=watched, allow=(bad,))
