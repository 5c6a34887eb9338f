"""Worker processes on this machine: one ``process_main`` subprocess per worker, linked by a socket pair."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection

import anyio

from demoforge.pipeline.workers.config import EpisodeAssignment, ExecutorConfig, WorkerStartError
from demoforge.pipeline.workers.episode_worker import Piece, WorkerSpec


class WorkerLost(Exception):
    """The worker's process or actor is gone (killed, crashed, node lost)."""


class ProcessWorker:
    """Driver-side handle of one worker process."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, conn: Connection, slot: int,
                 limiter: anyio.CapacityLimiter) -> None:
        self.proc, self._sock, self._conn, self.slot = proc, sock, conn, slot
        self._limiter = limiter
        self.pid: int | None = proc.pid
        self.host = socket.gethostname()

    @property
    def name(self) -> str:
        return f"worker {self.slot} (process, pid {self.pid})"

    async def _recv(self) -> tuple:
        try:
            return await anyio.to_thread.run_sync(self._conn.recv, abandon_on_cancel=True, limiter=self._limiter)
        except (EOFError, OSError) as exc:
            code = self.proc.poll()
            why = f"exit status {code}" if code is not None else f"link closed ({type(exc).__name__})"
            raise WorkerLost(f"{self.name} is gone: {why}") from None

    def _send(self, message: tuple) -> None:
        try:
            self._conn.send(message)
        except OSError as exc:
            raise WorkerLost(f"{self.name} is gone: {type(exc).__name__}") from None

    async def handshake(self, spec: WorkerSpec, max_in_flight: int, timeout_s: float) -> None:
        self._send(("spec", spec, max_in_flight))
        with anyio.move_on_after(timeout_s) as scope:
            try:
                message = await self._recv()
            except WorkerLost as exc:
                raise WorkerStartError(f"{exc} before it was ready") from None
        if scope.cancelled_caught:
            self.kill()
            raise WorkerStartError(f"{self.name} was not ready within {timeout_s:g} s")
        if message[0] == "error":
            self.kill()
            raise WorkerStartError(message[1])

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
        env.setdefault("MALLOC_ARENA_MAX", "2")  # see cli.limit_malloc_arenas: encoder threads' arenas
        for key, value in spec.environment.items():
            env.setdefault(key, value)
        proc = subprocess.Popen([sys.executable, "-m", "demoforge.pipeline.workers.process_main", str(child.fileno())],
                                pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL)
        child.close()
        worker = ProcessWorker(proc, parent, Connection(os.dup(parent.fileno())), slot, self._limiter)
        try:
            await worker.handshake(spec, self.config.max_in_flight, self.config.start_timeout_s)
        except BaseException:
            await worker.aclose()
            raise
        return worker

    async def aclose(self) -> None:
        return None
