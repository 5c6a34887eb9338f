"""Worker processes on this machine: one ``process_main`` subprocess per worker, linked by a socket pair."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection

import anyio

from demoforge.pipeline.workers.config import ExecutorConfig, WorkerStartError
from demoforge.pipeline.workers.episode_worker import Piece, WorkerSpec
from demoforge.stages.records import EpisodeAssignment


class WorkerLost(Exception):
    """The worker's process or actor is gone (killed, crashed, node lost)."""


class ProcessWorker:
    """Driver-side handle of one worker process."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, conn: Connection, slot: int,
                 limiter: anyio.CapacityLimiter, spec: WorkerSpec, max_in_flight: int) -> None:
        self.proc, self._sock, self._conn, self.slot = proc, sock, conn, slot
        self._limiter = limiter
        self._spec, self._max_in_flight = spec, max_in_flight
        self.pid: int | None = proc.pid
        self.host = socket.gethostname()

    @property
    def name(self) -> str:
        return f"worker {self.slot} (process, pid {self.pid})"

    async def _recv(self) -> tuple:
        try:
            return await anyio.to_thread.run_sync(self._conn.recv, abandon_on_cancel=True, limiter=self._limiter)
        except (EOFError, OSError) as exc:
            code = await anyio.to_thread.run_sync(self._exit_status, abandon_on_cancel=True)
            why = f"exit status {code}" if code is not None else f"link closed ({type(exc).__name__})"
            raise WorkerLost(f"{self.name} is gone: {why}") from None

    def _exit_status(self) -> int | None:
        """The exit status of a worker whose link just closed: it is usually exiting, give it a moment."""
        try:
            return self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def _send(self, message: tuple) -> None:
        try:
            self._conn.send(message)
        except OSError as exc:
            raise WorkerLost(f"{self.name} is gone: {type(exc).__name__}") from None

    async def ready(self) -> None:
        """Until the worker has built its env (no time limit here: the executor decides how long starts may
        take while no worker runs). A failed or cancelled start leaves no process behind."""
        try:
            self._send(("spec", self._spec, self._max_in_flight))
            try:
                message = await self._recv()
            except WorkerLost as exc:
                raise WorkerStartError(f"{exc} before it was ready") from None
            if message[0] == "error":
                raise WorkerStartError(message[1])
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise

    async def unplaced(self) -> str | None:
        return None  # a process runs at once: a slow start is only slow

    async def pieces(self, lease: EpisodeAssignment) -> AsyncIterator[Piece]:
        self._send(("lease", lease.episode_index, lease.first_attempt))
        while True:
            message = await self._recv()
            if message[0] == "fault":
                self.kill()
                raise WorkerLost(f"{self.name} failed outside any attempt: {message[1]}")
            piece: Piece = message[1]
            yield piece
            self._send(("ack",))  # the consumer has fed the piece to the write stage
            if piece.lease_done:
                return

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a receive blocked in a thread
        except OSError:
            pass

    async def aclose(self) -> None:
        self.kill()
        await anyio.to_thread.run_sync(self.proc.wait)
        self._conn.close()
        self._sock.close()


class ProcessBackend:
    """Starts worker processes with this interpreter; they inherit the environment and import path."""

    kind = "process"

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config
        self._limiter = anyio.CapacityLimiter(config.workers + 4)  # one blocked receive per worker

    async def connect(self) -> str:
        return f"{self.config.workers} worker process(es) on this machine"

    async def start_worker(self, slot: int, spec: WorkerSpec) -> ProcessWorker:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        # The worker imports what this process can: its import path (tests and embedding programs extend it).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        env.setdefault("MALLOC_ARENA_MAX", "2")  # see stages/malloc.py limit_malloc_arenas: encoder threads' arenas
        for key, value in spec.environment.items():
            env.setdefault(key, value)
        proc = subprocess.Popen([sys.executable, "-m", "demoforge.pipeline.workers.process_main", str(child.fileno())],
                                pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL)
        child.close()
        return ProcessWorker(proc, parent, Connection(os.dup(parent.fileno())), slot, self._limiter, spec,
                             self.config.max_in_flight)

    async def lacks_room(self) -> str | None:
        return None  # this machine always has room for another process; a slow start is only slow

    async def aclose(self) -> None:
        return None
