"""The package as a user installs it: a built wheel works in a clean venv, not only the editable checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from helpers import REPO


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DEMOFORGE_TASK_MODULES"}}
    env.setdefault("MUJOCO_GL", "egl")
    return env


@pytest.mark.slow
def test_built_wheel_installs_into_a_clean_venv_and_runs(tmp_path: Path) -> None:
    # Build from a copy (symlinks kept as links): setuptools leaves a build/ folder beside the sources.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "runs", "out", "*.egg-info", "__pycache__", ".pytest_cache", ".mypy_cache", "*.so"))
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(source)], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, env=_clean_env())
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("demoforge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # The symlinked subpackages are packed as real files, every module of them.
    for folder in ("pipeline", "stages", "storage"):
        expected = {f"demoforge/{folder}/{p.relative_to(REPO / folder).as_posix()}"
                    for p in (REPO / folder).rglob("*.py")}
        assert expected and expected <= names, sorted(expected - names)[:5]
    # The one compiled part (storage/rgb_sums.c), built by the wheel itself (the copy left the checkout's out).
    assert [n for n in names if n.startswith("demoforge/storage/_rgb_sums") and n.endswith(".so")], sorted(names)[:5]

    # A clean venv; the heavy dependencies (torch, lerobot, mujoco) come from the test venv as a plain path
    # entry, which does not run that venv's .pth files, so the editable checkout stays invisible.
    target = tmp_path / "venv"
    venv.create(target, with_pip=False)
    purelib = Path(sysconfig.get_paths(vars={"base": str(target), "platbase": str(target)})["purelib"])
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install",
                              "-q", "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL, env=_clean_env())
    assert install.returncode == 0, install.stderr

    where = subprocess.run([str(target / "bin" / "python"), "-c", "import demoforge.pipeline.cli as m; print(m.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_clean_env())
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(target), where.stdout

    # The installed package computes a camera's statistics with its compiled sums.
    stats = subprocess.run([str(target / "bin" / "python"), "-c",
                            "import numpy as np; from demoforge.storage.lerobot_stats import rgb_stats; "
                            "print(rgb_stats([np.full((4, 4, 3), 51, np.uint8)] * 2)['mean'].ravel().tolist())"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_clean_env())
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout) == pytest.approx([0.2, 0.2, 0.2]), stats.stdout

    tasks = subprocess.run([str(target / "bin" / "demoforge"), "tasks", "--json"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=_clean_env(), stdin=subprocess.DEVNULL)
    assert tasks.returncode == 0, tasks.stderr
    assert {"fetch-pick-place", "aloha-transfer-cube"} <= {t["name"] for t in json.loads(tasks.stdout)}


def test_editable_install_is_a_plain_path_entry() -> None:
    """A second checkout sharing the venv imports its own code when it puts itself first on sys.path."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    pth = list(purelib.glob("__editable__*demoforge*.pth"))
    if not pth:
        pytest.fail("demoforge is not installed in editable mode in this venv (run tools/setup.sh)")
    lines = [line for line in pth[0].read_text().splitlines() if line.strip()]
    assert lines and not any(line.startswith("import ") for line in lines), lines
    assert not list(purelib.glob("__editable___demoforge*finder.py"))
