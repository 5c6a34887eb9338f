"""Run one export in a watched child process (``demoforge export``), for the daemon and ``generate --export``.

Why a process and not a thread: an export imports LeRobot (torch, datasets, pandas) and holds an episode's
frames while it writes; in the daemon that lifted RSS from about 450 MB to 1.2 GB for the rest of its life.
In a child the memory goes back to the OS when the export ends, and a crash or an OOM kill of the export ends
only the child: the daemon logs it and keeps generating, and the dataset stays at its last published version
(publishing is one atomic link swap, see export.md); the next export completes the work.

Watched: the child reports each step and episode to its parent over a pipe (JSON lines). A child that reports
nothing for ``progress_timeout_s`` (default 10 minutes; while it starts, which imports torch and lerobot, at
least ``STARTUP_ALLOWANCE_S``), or that has published but reports nothing for ``EXIT_GRACE_S`` more (at most the
timeout), is ended: first ``SIGUSR1``, on which ``faulthandler`` writes every thread's stack to a file the
parent names, then ``SIGKILL``. Ended before publishing, the dataset stays at its last published
version; ended after, the publish counts (the next export reconciles the catalog if the child died before
recording it).

A finished child leaves with ``os._exit`` once its report is out: after publishing, an export child spent
3.5-40 s (measured under load) in the interpreter's final garbage collection and module teardown of
torch/lerobot/datasets, with its other threads idle in futex waits; nothing of that is needed once the
version is published and the catalog committed.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anyio.abc

STDERR_TAIL_LINES = 6
PARENT_ENV = "DEMOFORGE_EXPORT_PARENT"  # set for the child: the pid it must not outlive
PROGRESS_FD_ENV = "DEMOFORGE_EXPORT_PROGRESS_FD"  # the pipe the child reports on
STACKS_ENV = "DEMOFORGE_EXPORT_STACKS"  # the file faulthandler writes the child's stacks to on SIGUSR1
DEFAULT_PROGRESS_TIMEOUT_S = 600.0
EXIT_GRACE_S = 20.0  # after publishing, the most a child may go without a word before it is ended
STARTUP_ALLOWANCE_S = 300.0  # before it is ready (interpreter start and imports), the least it is given
DUMP_WAIT_S = 3.0  # how long the stacks may take to be written after SIGUSR1


def die_with_parent() -> None:
    """In an export child: be killed when the parent dies (Linux ``PR_SET_PDEATHSIG``). A daemon killed with
    SIGKILL must not leave its export running: the orphan would hold the dataset's export lock and the
    restarted daemon's exports would be refused. Killing an export midway is safe (atomic publish)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


# ------------------------------------------------------------------------------------------ child side
class ChildChannel:
    """In an export child started by :func:`export_in_child`: reports to the parent, dumps stacks on SIGUSR1."""

    def __init__(self, progress: IO[str], stacks: IO[str] | None) -> None:
        self._progress = progress
        self._stacks = stacks  # kept open: faulthandler writes to its descriptor
        if stacks is not None:
            faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    @classmethod
    def from_environment(cls) -> ChildChannel | None:
        """The channel when this process is a watched export child (None otherwise); dies with its parent."""
        fd = os.environ.get(PROGRESS_FD_ENV)
        if not fd:
            return None
        die_with_parent()
        stacks_path = os.environ.get(STACKS_ENV)
        stacks = open(stacks_path, "a") if stacks_path else None  # noqa: SIM115 (lives as long as the process)
        channel = cls(os.fdopen(int(fd), "w", buffering=1), stacks)
        from demoforge.storage.lerobot.files import import_libraries

        import_libraries()  # the silent part of starting (pyarrow, pandas): before "ready"
        channel.event("ready")
        return channel

    def event(self, event: str, **fields: Any) -> None:
        """One line to the parent; every line counts as progress."""
        try:
            self._progress.write(json.dumps({"event": event, **fields}, default=str) + "\n")
        except (BrokenPipeError, ValueError):  # the parent is gone: the death signal follows
            pass

    def exit(self, code: int) -> None:
        """Leave now, skipping the interpreter's teardown (see the module docstring): everything the export
        wrote is durable and its report is out."""
        for stream in (sys.stdout, sys.stderr, self._progress):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


# ----------------------------------------------------------------------------------------- parent side
@dataclass(frozen=True)
class ExportOutcome:
    """How an export child ended: its report when it published (or had nothing to add), else why not.
    ``stalled`` says why the watchdog ended it, ``stacks`` where its threads' stacks were dumped first."""

    returncode: int
    report: dict[str, Any] | None
    error: str
    stalled: str | None = None
    stacks: Path | None = None
    stack_text: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        """The export did its work: a child ended after publishing counts too."""
        return self.report is not None

    def exit_text(self) -> str:
        if self.stalled is not None:
            return f"ended by the watchdog ({self.stalled})"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"


def export_argv(store: Path, out: Path, repo_id: str | None, *, json_report: bool) -> list[str]:
    argv = [sys.executable, "-m", "demoforge.pipeline.cli", "export", "--store", str(store), "--out", str(out)]
    if repo_id:
        argv += ["--repo-id", repo_id]
    if json_report:
        argv.append("--json")
    return argv


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-STDERR_TAIL_LINES:])


class _Watch:
    """What the parent knows of the child: updated by the thread reading the progress pipe."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.step = "starting"
        self.ready = False
        self.published_at: float | None = None
        self.report: dict[str, Any] | None = None

    def read(self, fd: int) -> None:
        with os.fdopen(fd, "r") as lines:
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                self.last = time.monotonic()
                name = event.pop("event", "")
                self.step = event.get("step") or name
                self.ready = True
                if name in ("published", "report"):
                    self.report = event
                    self.published_at = self.published_at or self.last

    def overdue(self, progress_timeout_s: float, exit_grace_s: float) -> str | None:
        quiet = time.monotonic() - self.last
        grace = min(exit_grace_s, progress_timeout_s)
        if self.published_at is not None and quiet > grace:
            return f"it published version {self.report.get('version') if self.report else '?'} but did not exit " \
                   f"within {grace:.0f} s"
        allowed = progress_timeout_s if self.ready else max(progress_timeout_s, STARTUP_ALLOWANCE_S)
        if quiet > allowed:
            return f"it reported no progress for {allowed:.0f} s (last step: {self.step})"
        return None


async def _end(process: anyio.abc.Process, stacks: Path) -> str:
    """faulthandler's stacks (SIGUSR1), then SIGKILL; returns the stacks written."""
    import anyio  # here, not at the top: the child (`demoforge export`) and `--help` need none of it

    try:
        process.send_signal(signal.SIGUSR1)
    except ProcessLookupError:
        return ""
    deadline, size, steady = time.monotonic() + DUMP_WAIT_S, -1, 0
    while time.monotonic() < deadline and steady < 3:  # written once it stops growing
        await anyio.sleep(0.1)
        now = stacks.stat().st_size if stacks.exists() else 0
        steady = steady + 1 if now == size and now > 0 else 0
        size = now
    try:
        process.kill()
    except ProcessLookupError:
        pass
    return stacks.read_text(errors="replace") if stacks.exists() else ""


async def export_in_child(store: Path, out: Path, repo_id: str | None = None, *,
                          progress_timeout_s: float = DEFAULT_PROGRESS_TIMEOUT_S, exit_grace_s: float = EXIT_GRACE_S,
                          capture_output: bool = True,
                          on_stalled: Callable[[str], None] | None = None) -> ExportOutcome:
    """Export in a watched child process and wait for it; never raises for the child's failure.

    ``capture_output``: keep the child's stdout and stderr (their tail explains a failure); otherwise they
    are this process's (``generate --export`` shows the child's own output). A cancelled wait (the daemon
    stopping) kills the child; an export killed midway publishes nothing."""
    import anyio

    read_fd, write_fd = os.pipe()
    stacks_fd, stacks_name = tempfile.mkstemp(prefix="export-stacks-", suffix=".txt", dir=store)
    os.close(stacks_fd)
    stacks = Path(stacks_name)
    env = {**os.environ, PARENT_ENV: str(os.getpid()), PROGRESS_FD_ENV: str(write_fd), STACKS_ENV: str(stacks)}
    pipe = subprocess.PIPE if capture_output else None  # None: this process's own streams
    watch = _Watch()
    output: dict[str, bytes] = {"stdout": b"", "stderr": b""}
    try:
        process = await anyio.open_process(export_argv(store, out, repo_id, json_report=False),
                                           stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, env=env,
                                           pass_fds=(write_fd,))
    except BaseException:
        os.close(read_fd)
        stacks.unlink(missing_ok=True)
        raise
    finally:
        os.close(write_fd)  # the child holds the write end now: end of file when it exits
    try:
        async with process, anyio.create_task_group() as tg:
            tg.start_soon(_collect, output, "stdout", process.stdout)
            tg.start_soon(_collect, output, "stderr", process.stderr)
            tg.start_soon(lambda: anyio.to_thread.run_sync(watch.read, read_fd, abandon_on_cancel=True))
            stalled, dumped = await _wait_or_end(process, watch, stacks, progress_timeout_s, exit_grace_s,
                                                 on_stalled)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
    if stalled is None:
        stacks.unlink(missing_ok=True)
    returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
    stdout, stderr = output["stdout"].decode(errors="replace"), output["stderr"].decode(errors="replace")
    error = _tail(stderr)
    if watch.report is None and returncode == 0:
        error = f"the export reported no result: {_tail(stdout)!r}"
    return ExportOutcome(returncode, watch.report, error, stalled, stacks if stalled is not None else None, dumped)


async def _collect(output: dict[str, bytes], name: str, stream: anyio.abc.ByteReceiveStream | None) -> None:
    """What the child writes on one of its streams (None: they are this process's own)."""
    if stream is not None:
        async for chunk in stream:
            output[name] += chunk


async def _wait_or_end(process: anyio.abc.Process, watch: _Watch, stacks: Path, progress_timeout_s: float,
                       exit_grace_s: float, on_stalled: Callable[[str], None] | None) -> tuple[str | None, str]:
    """Wait for the child, ending it once it stops making progress: (why it was ended, the stacks it dumped)."""
    import anyio

    while True:
        with anyio.move_on_after(0.5):
            await process.wait()
            return None, ""
        stalled = watch.overdue(progress_timeout_s, exit_grace_s)
        if stalled is not None:
            if on_stalled is not None:
                on_stalled(stalled)
            dumped = await _end(process, stacks)
            await process.wait()
            return stalled, dumped
