"""Shared test helpers: run the real CLI in a subprocess, read stores back, compare video."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np

from demoforge.storage.catalog import AttemptRow
from demoforge.storage.staging import StagedEpisode, StagingStore

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


def cli_env(**extra: str | None) -> dict[str, str]:
    """The test process's environment for a CLI subprocess; a None value removes that variable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))
    env["DEMOFORGE_TASK_MODULES"] = "toy_tasks"
    env.setdefault("MUJOCO_GL", "egl")
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def demoforge_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "demoforge.pipeline.cli", *args]


def run_cli(*args: str, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(demoforge_argv(*args), env=cli_env(**extra_env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def packages_imported_by(module: str, packages: set[str]) -> list[str]:
    """Which of ``packages`` importing ``module`` loads, in a fresh interpreter (start-up cost is what it imports)."""
    code = (f"import json, sys, {module}; "
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def attempts_now(store: Path, states: tuple[str, ...] | None = None) -> list:
    """The catalog's attempt rows (of ``states``) at this moment, safe while a job writes the store; empty
    before the job has created its catalog."""
    from demoforge.storage.catalog import Catalog
    from demoforge.storage.paths import CATALOG_FILE
    from demoforge.storage.errors import StoreError

    if not (store / CATALOG_FILE).exists():
        return []
    try:
        catalog = Catalog.open_read_only(store)
    except StoreError:  # being created this moment
        return []
    try:
        return catalog.attempts(states)
    finally:
        catalog.close()


def attempt_marks_of(store: Path) -> Path:
    """Where a job on ``store`` marks its attempts: pass ``DEMOFORGE_ATTEMPT_MARKS=str(attempt_marks_of(store))``
    (storage/faults.py: the write stage notes each attempt's first frame and its end)."""
    return store.parent / f"{store.name}.marks"


def attempts_mid_episode(store: Path) -> dict[str, int]:
    """The attempts whose first frame reached the write stage and whose end has not: episode id -> worker."""
    marks = attempt_marks_of(store)
    lines = [line.split() for line in (marks.read_text().splitlines() if marks.exists() else [])]
    ended = {f[1] for f in lines if f[0] == "ended"}
    return {f[1]: int(f[2]) for f in lines if f[0] == "frames" and f[1] not in ended}


def kill_after_start(argv: list[str], store: Path, delay_s: float, env: dict[str, str] | None = None,
                     start_timeout_s: float = 120) -> bool:
    """Run ``argv`` (a command writing ``store``), wait until it has created the store's catalog (start-up time
    varies with load), let it work ``delay_s`` more, then SIGKILL it. True when the kill landed (False: the
    command had already exited)."""
    return kill_once_started(argv, lambda: (store / "catalog.sqlite").exists(), delay_s, env, start_timeout_s)


def kill_once_started(argv: list[str], started: Callable[[], bool], delay_s: float,
                      env: dict[str, str] | None = None, start_timeout_s: float = 120) -> bool:
    """Run ``argv``, wait until ``started()`` (it has begun writing), let it work ``delay_s`` more, then SIGKILL
    it. True when the kill landed (False: the command had already exited)."""
    proc = subprocess.Popen(argv, env=env if env is not None else cli_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + start_timeout_s
    while not started() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay_s)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return killed


def kill_at_step(argv: list[str], step: str, marker: Path, timeout_s: float = 120) -> None:
    """Run a command that publishes a dataset (export, edit, merge) so that it blocks at ``step`` (``STEP`` or
    ``STEP#N``: storage/faults.py; the hook creates ``marker`` when it blocks), wait for that moment, SIGKILL it."""
    proc = subprocess.Popen(argv, env=cli_env(DEMOFORGE_EXPORT_HANG=step, DEMOFORGE_EXPORT_HANG_ONCE=str(marker)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert proc.poll() is None, f"the command ended before reaching {step}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"the command did not reach {step} in {timeout_s:g} s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


def daemon_events(stderr: str) -> list[dict]:
    """The JSON log records (`demoforge daemon --json-logs`) among a daemon's stderr lines."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def decode_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    return frames


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def committed_files(store: Path) -> dict[str, dict[str, bytes]]:
    """Every file of every committed episode's staged folder, by episode id (for byte-identity checks)."""
    from demoforge.storage.store import open_store

    out: dict[str, dict[str, bytes]] = {}
    with open_store(store) as view:
        _fingerprint, staging = view.require_job()
        bases = {r.episode_id: staging.episode_path(r.episode_id) for r in view.catalog.committed()}
    for episode_id, base in bases.items():
        out[episode_id] = {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
    return out


def read_row(staging: StagingStore, row: AttemptRow) -> StagedEpisode:
    """A committed attempt's episode read back from staging (a committed row always knows its frame count)."""
    assert row.frames is not None, f"attempt {row.episode_id} has no frame count: not committed"
    return staging.read_episode(row.episode_id, row.frames, row.video_bytes)
