"""Run one export in a child process (``demoforge export --json``), for the daemon and ``generate --export``.

Why a process and not a thread: an export imports LeRobot (torch, datasets, pandas) and holds an episode's
frames while it writes; in the daemon that lifted RSS from about 450 MB to 1.2 GB for the rest of its life.
In a child the memory goes back to the OS when the export ends, and a crash or an OOM kill of the export ends
only the child: the daemon logs it and keeps generating, and the dataset stays at its last published version
(publishing is one atomic link swap, see export.md); the next export completes the work.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

STDERR_TAIL_LINES = 6
PARENT_ENV = "DEMOFORGE_EXPORT_PARENT"  # set for the child: the pid it must not outlive


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


@dataclass(frozen=True)
class ExportOutcome:
    """How an export child ended: its JSON report when it succeeded, else why it did not."""

    returncode: int
    report: dict[str, Any] | None
    error: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.report is not None

    def exit_text(self) -> str:
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


async def export_in_child(store: Path, out: Path, repo_id: str | None = None) -> ExportOutcome:
    """Export in a child process and wait for it; never raises for the child's failure."""
    # A cancelled wait (the daemon stopping) kills the child; an export killed midway publishes nothing.
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    result = await anyio.run_process(export_argv(store, out, repo_id, json_report=True), check=False, env=env)
    stdout, stderr = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    report = None
    if result.returncode == 0:
        try:
            report = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return ExportOutcome(result.returncode, None, f"the export printed no JSON report: {_tail(stdout)!r}")
    return ExportOutcome(result.returncode, report, _tail(stderr))
