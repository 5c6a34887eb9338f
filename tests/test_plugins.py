"""Bringing one's own task: installed entry-point plugins, ``module:factory`` specs, broken plugins, and the
`tasks` listing a person copies names from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, TESTS, run_cli

EXAMPLE = REPO / "docs" / "examples" / "demoforge-example-task"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worked example package, installed as a user would (pip, from its own pyproject) into a folder."""
    site = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / EXAMPLE.name  # setuptools builds inside the source folder
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(site), str(source)], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return site


def with_path(*folders: Path) -> str:
    return os.pathsep.join([*map(str, folders), str(TESTS), os.environ.get("PYTHONPATH", "")])


@pytest.mark.slow
def test_installed_plugin_is_listed_generated_and_exported(plugin_site: Path, tmp_path: Path) -> None:
    listed = run_cli("tasks", "--json", PYTHONPATH=with_path(plugin_site))
    assert listed.returncode == 0, listed.stderr
    tasks = {t["name"]: t for t in json.loads(listed.stdout)}
    assert tasks["slider-reach"]["cameras"] == {"overhead": [64, 64, 3], "side": [32, 64, 3]}
    assert "fetch-pick-place" in tasks  # a plugin adds to the built-ins

    detail = run_cli("tasks", "slider-reach", PYTHONPATH=with_path(plugin_site))
    assert detail.returncode == 0, detail.stderr
    assert "segments (2): approach settle" in detail.stdout and "option size = 64" in detail.stdout

    store, dataset = tmp_path / "store", tmp_path / "dataset"
    gen = run_cli("generate", "--task", "slider-reach", "--episodes", "3", "--store", str(store), "--codec", "h264",
                  "--export", str(dataset), PYTHONPATH=with_path(plugin_site))
    assert gen.returncode == 0, gen.stderr
    valid = run_cli("validate", str(dataset), "--expect-segments", "2", "--json", PYTHONPATH=with_path(plugin_site))
    assert valid.returncode == 0, valid.stdout + valid.stderr
    report = json.loads(valid.stdout)
    assert report["episodes"] == 3

    # Worker processes load the plugin the same way (by its entry point) and commit the same episodes.
    remote = tmp_path / "remote"
    gen = run_cli("generate", "--task", "slider-reach", "--episodes", "3", "--store", str(remote), "--codec", "h264",
                  "--executor", "process", "--workers", "2", PYTHONPATH=with_path(plugin_site))
    assert gen.returncode == 0, gen.stderr
    from demoforge.storage.crash_invariants import attempt_rows, identities

    assert identities(attempt_rows(remote)) == identities(attempt_rows(store))


@pytest.mark.slow
def test_module_factory_spec_loads_a_task_that_is_not_installed(tmp_path: Path) -> None:
    spec = "demoforge_example_task:task"
    store = tmp_path / "store"
    gen = run_cli("generate", "--task", spec, "--episodes", "2", "--store", str(store), "--codec", "h264",
                  PYTHONPATH=with_path(EXAMPLE))
    assert gen.returncode == 0, gen.stderr
    status = run_cli("status", "--store", str(store), "--json", PYTHONPATH=with_path(EXAMPLE))
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["attempts_by_state"] == {"committed": 2} and summary["fingerprint"]["task"] == spec

    missing = run_cli("run", "--task", "no_such_module:task", "--episodes", "1")
    assert missing.returncode == 2
    assert "no_such_module:task" in missing.stderr and "ModuleNotFoundError" in missing.stderr


def _broken_plugin(site: Path) -> None:
    """An installed distribution (as pip lays one out) whose task module fails to import."""
    dist = site / "broken_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[demoforge.tasks]\nbroken-task = broken_plugin_mod:task\n")
    (site / "broken_plugin_mod.py").write_text("raise ImportError('needs libfoo, which is not installed')\n")


def test_a_broken_plugin_is_named_and_hides_no_other_task(plugin_site: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    _broken_plugin(broken)
    path = with_path(broken, plugin_site)
    listed = run_cli("tasks", "--json", PYTHONPATH=path)
    assert listed.returncode == 0, listed.stderr
    names = {t["name"] for t in json.loads(listed.stdout)}
    assert {"fetch-pick-place", "aloha-transfer-cube", "slider-reach"} <= names and "broken-task" not in names
    assert "task plugin 'broken-task'" in listed.stderr and "needs libfoo" in listed.stderr

    run = run_cli("run", "--task", "broken-task", "--episodes", "1", PYTHONPATH=path)
    assert run.returncode == 2
    assert "broken-task" in run.stderr and "ImportError: needs libfoo" in run.stderr
    assert "Traceback" not in run.stderr

    # A broken module named in DEMOFORGE_TASK_MODULES is reported the same way and hides nothing either.
    env_module = run_cli("tasks", "--json", PYTHONPATH=path, DEMOFORGE_TASK_MODULES="toy_tasks,broken_plugin_mod")
    assert env_module.returncode == 0, env_module.stderr
    assert "toy-point" in {t["name"] for t in json.loads(env_module.stdout)}
    assert "task plugin 'broken_plugin_mod'" in env_module.stderr


def test_task_names_never_wrap_in_80_columns() -> None:
    listed = run_cli("tasks", COLUMNS="80")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines and all(len(line.rstrip()) <= 80 for line in lines), lines
    for name in ("fetch-pick-place", "aloha-transfer-cube", "toy-point"):
        assert any(line.split() and line.split()[0] == name for line in lines), (name, lines)
    fetch = next(line for line in lines if line.startswith("fetch-pick-place"))
    assert fetch.split()[1:] == ["25", "front", "224x224", "(4,)"]  # its fps, camera and action too
