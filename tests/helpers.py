"""Shared test helpers: run the real CLI in a subprocess, read stores back, compare video."""

from __future__ import annotations

import atexit
import io
import json
import multiprocessing
import multiprocessing.context
import os
import signal
import subprocess
import sys
import tempfile
import threading
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


#: What the server that forks :func:`run_cli`'s processes imports once: the CLI, the libraries most commands load,
#: and LeRobot's dataset module (about 10 CPU-s with torch, paid by every ``validate``, ``repair``, ``eval`` and
#: ``--driver`` command). None of them reads the environment on import but MuJoCo (``MUJOCO_GL``, which the tests
#: set before the server starts). A module that fails to import is skipped by the server and imported by the
#: command itself, as it would be anyway.
CLI_PRELOAD = ["demoforge.pipeline.cli", "demoforge.pipeline.cli.generate", "demoforge.pipeline.cli.export",
               "demoforge.pipeline.cli.replay", "demoforge.pipeline.cli.store", "demoforge.pipeline.runner",
               "demoforge.storage.lerobot.export", "zarr", "av", "pandas", "mujoco", "gymnasium", "metaworld",
               "gymnasium_robotics", "lerobot.datasets.lerobot_dataset"]
_forks: multiprocessing.context.ForkServerContext | None = None
#: ``fresh``: :func:`run_cli` starts a fresh interpreter per command (what the suite did before the fork server).
FRESH_CLI_ENV = "DEMOFORGE_TESTS_CLI"


def run_cli(*args: str, timeout: float = 300, fresh: bool = False,
            **extra_env: str) -> subprocess.CompletedProcess[str]:
    """Run ``demoforge ARGS`` in a process of its own, as ``subprocess.run`` would (exit status, stdout, stderr,
    no stdin), but forked from a server that has imported the CLI once (:data:`CLI_PRELOAD`).

    A command started from a fresh interpreter spends 1-1.7 CPU-s importing before it does anything, and the
    suite runs hundreds of them; the forked process runs the same ``main`` with the same argument list,
    environment and working directory. Tests about the process itself (kills, signals, start-up imports) start a
    fresh interpreter with :func:`demoforge_argv`, and so does ``fresh=True`` (what a command prints while it
    starts, such as a library's import-time notice, is seen only there); ``DEMOFORGE_TESTS_CLI=fresh`` makes every
    command do so."""
    if fresh or os.environ.get(FRESH_CLI_ENV) == "fresh":
        return subprocess.run(demoforge_argv(*args), env=cli_env(**extra_env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    global _forks
    if _forks is None:
        _forks = multiprocessing.get_context("forkserver")
        _forks.set_forkserver_preload(CLI_PRELOAD)
    argv = demoforge_argv(*args)
    with tempfile.TemporaryDirectory(prefix="demoforge-cli-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        out.touch()
        err.touch()
        process = _forks.Process(target=_forked_cli, args=(list(args), cli_env(**extra_env), os.getcwd(), out, err))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(argv, process.exitcode, out.read_text(), err.read_text())


def _forked_cli(args: list[str], env: dict[str, str], cwd: str, out: Path, err: Path) -> None:
    """The forked process: become what ``python -m demoforge.pipeline.cli ARGS`` would be, run it, and end as
    the interpreter would (non-daemon threads joined, ``atexit`` run, streams flushed, the exit status)."""
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    os.chdir(cwd)
    for fd, path in ((0, os.devnull), (1, out), (2, err)):
        opened = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    sys.argv = [str(REPO / "pipeline" / "cli" / "__main__.py"), *args]
    from demoforge.pipeline.cli import main

    status: str | int | None
    try:
        status = main(args)
    except SystemExit as exit_:
        status = exit_.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    if status is not None and not isinstance(status, int):
        print(status, file=sys.stderr)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status or 0)


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
        bases = {r.episode_id: staging.episode_path(r.episode_id) for r in view.committed()}
    for episode_id, base in bases.items():
        out[episode_id] = {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
    return out


def read_row(staging: StagingStore, row: AttemptRow) -> StagedEpisode:
    """A committed attempt's episode read back from staging (a committed row always knows its frame count)."""
    assert row.frames is not None, f"attempt {row.episode_id} has no frame count: not committed"
    return staging.read_episode(row.episode_id, row.frames, row.video_bytes)
