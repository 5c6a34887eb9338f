"""Entry point of one worker process: ``python -m demoforge.pipeline.workers.process_main FD``.

FD is this end of a socket pair to the driver. Messages are pickled tuples (process-to-process on one
machine, never stored):

- driver -> worker: ``("spec", WorkerSpec, max_in_flight)`` once, then ``("lease", episode, first_attempt)``
  and ``("ack",)`` for every piece the write stage has taken;
- worker -> driver: ``("ready", pid, host)`` or ``("error", message)``, then ``("piece", Piece)``.

A worker never has more than ``max_in_flight`` pieces unacknowledged: when the driver's writer is slow the
worker blocks here, between env steps. It exits when the driver goes away: end of file on the socket, or
(while busy in env code) a watcher thread seeing its parent process change.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)  # the driver died: nothing of this worker may outlive it


class _Link:
    def __init__(self, conn: Connection, max_in_flight: int) -> None:
        self.conn = conn
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    def handle(self, message: tuple) -> tuple | None:
        """Account an ack; return any other message."""
        if message[0] == "ack":
            self.in_flight -= 1
            return None
        return message

    def send_piece(self, piece: object) -> None:
        while self.in_flight >= self.max_in_flight:
            leftover = self.handle(self.conn.recv())
            if leftover is not None:
                raise RuntimeError(f"unexpected message while a lease runs: {leftover[0]!r}")
        self.conn.send(("piece", piece))
        self.in_flight += 1


def main(argv: list[str]) -> int:
    from demoforge.storage.scheduling import reset_process_priority

    reset_process_priority()  # a worker runs at normal priority whatever its parent's state
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
    conn = Connection(int(argv[1]))
    try:
        kind, spec, max_in_flight = conn.recv()
    except (EOFError, OSError):
        return 0
    from demoforge.pipeline.workers.config import WorkerStartError
    from demoforge.pipeline.workers.episode_worker import EpisodeWorker, format_exception

    try:
        worker = EpisodeWorker(spec)
    except WorkerStartError as exc:
        conn.send(("error", str(exc)))
        return 0
    except Exception as exc:
        conn.send(("error", f"worker {spec.worker} cannot start: {format_exception(exc)}"))
        return 0
    conn.send(("ready", os.getpid(), socket.gethostname()))
    link = _Link(conn, max_in_flight)
    try:
        while True:
            message = link.handle(conn.recv())
            if message is None:
                continue
            if message[0] != "lease":
                raise RuntimeError(f"unexpected message {message[0]!r}")
            _, episode, first_attempt = message
            for piece in worker.run_lease(episode, first_attempt):
                link.send_piece(piece)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the driver closed the link: the job ended or the driver died
    except Exception as exc:  # a worker fault outside any attempt: tell the driver, which re-runs the lease
        try:
            conn.send(("fault", format_exception(exc)))
        except OSError:
            pass
        return 1
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
