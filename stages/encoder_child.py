"""Entry point of a worker's encoder process: ``python -m demoforge.stages.encoder_child FD``.

FD is this end of a socket pair to the worker (stages/encoder_process.py), MEMFD the frames' shared memory.
Messages are pickled tuples between the two processes of one worker (never stored): ``("setup", cameras, fps,
video settings, statistics folder, slots, idle)`` once, then ``("frame", key, slot)``, ``("end", key, keep)``,
``("hurry",)`` (the parent waits for a result) and ``("quit",)``; back: ``("ok", result, busy seconds)`` per job
in order, or ``("error", exception)`` once (the lane's own error, so a full disk stays a ``StorageWriteError``; one
that cannot be pickled comes as an ``EncoderError`` naming it).
"""

from __future__ import annotations

import functools
import mmap
import os
import pickle
import queue
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from demoforge.stages.camera_encoder import EncoderError, make_recording_encoder
from demoforge.stages.encode_lanes import LaneSet
from demoforge.stages.encoder_process import frame_layout
from demoforge.storage.scheduling import reset_process_priority, set_process_class


class EncoderPriority:
    """The encoder process's idle priority (``--encoder-priority auto``, the default, or ``idle``): the encoding
    threads (the lanes, SVT-AV1's, OpenBLAS's) in the SCHED_IDLE class from construction on, so the simulator gets
    the cores first; raised to normal while the worker waits for a result and put back once every job it submitted
    has its result, so other programs that keep the cores busy can slow the job, never starve it. The threads in
    ``spare`` (this process's main thread, which reads the worker's messages, and the result sender) stay normal:
    they barely compute, and a hurry must be read at once."""

    def __init__(self, spare: set[int]) -> None:
        self._spare = spare
        self._lock = threading.Lock()
        self._backlog = 0  # jobs submitted whose result has not gone back
        self._lower()

    def spare(self, tid: int) -> None:
        with self._lock:
            self._spare.add(tid)

    def _lower(self) -> None:
        set_process_class(os.SCHED_IDLE, self._spare)
        self._raised = False

    def submitted(self) -> None:
        with self._lock:
            self._backlog += 1

    def hurry(self) -> None:
        with self._lock:
            if not self._raised:
                set_process_class(os.SCHED_OTHER, self._spare)
                self._raised = True

    def settle(self) -> None:
        """After a result went back: lower again once no job waits for its result. (A hurry always follows the
        job it waits for, so it finds the threads lowered and raises them again.)"""
        with self._lock:
            self._backlog -= 1
            if self._backlog == 0 and self._raised:
                self._lower()


def serve(conn: Connection, memfd: int) -> None:
    """A LaneSet fed from the socket; a second thread sends each job's result back in order."""
    reset_process_priority()  # normal priority whatever the parent's state
    try:
        _, cameras, fps, settings, stats_dir, slots, idle = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    layout, slot_bytes = frame_layout(cameras)
    buffer = mmap.mmap(memfd, slot_bytes * slots)
    lanes = LaneSet({c.name: functools.partial(make_recording_encoder, c, fps, settings, stats_dir=stats_dir)
                     for c in cameras})
    jobs: queue.SimpleQueue[bool] = queue.SimpleQueue()  # one token per job submitted; False: stop
    # Lowers every thread but this one (OpenBLAS's pool, the lanes); SVT-AV1's threads, started later by a lane,
    # inherit its class.
    priority = EncoderPriority({threading.get_native_id()}) if idle else None

    def send_results() -> None:
        while jobs.get():
            try:
                result = lanes.take_result()
                message: tuple[Any, ...] = ("ok", result, lanes.busy_seconds())
            except BaseException as exc:  # an encoder failed: the parent raises the same error at this result
                message = ("error", exc)
            try:
                try:
                    conn.send(message)
                except (pickle.PicklingError, TypeError, AttributeError):  # an error that cannot cross: named
                    failure = message[1]
                    conn.send(("error", EncoderError(f"{type(failure).__name__}: {failure}")))
            except OSError:
                return  # the parent is gone; the main loop sees it too
            if message[0] == "error":
                return
            if priority is not None:
                priority.settle()

    sender = threading.Thread(target=send_results, name="encoder-results", daemon=True)
    sender.start()
    if priority is not None and sender.native_id is not None:
        priority.spare(sender.native_id)  # started by this thread: normal already
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            if priority is not None and message[0] in ("frame", "end"):
                priority.submitted()  # before the job reaches the lanes: its result cannot come back first
            if message[0] == "frame":
                _, key, slot = message
                base = slot * slot_bytes
                lanes.submit_frame(key, {c.name: np.ndarray(c.shape, layout[c.name][1], buffer=buffer,
                                                             offset=base + layout[c.name][0]) for c in cameras})
                jobs.put(True)
            elif message[0] == "end":
                _, key, keep = message
                lanes.submit_end(key, keep)
                jobs.put(True)
            elif message[0] == "hurry":
                if priority is not None:
                    priority.hurry()
            else:
                break
    finally:
        jobs.put(False)
        lanes.shutdown()  # each lane finishes its frame and aborts the encoders it holds
        # No interpreter teardown: the lanes are stopped, and a result sender still waiting for a job the
        # parent no longer wants (it quit mid-attempt) has nothing to flush.
        os._exit(0)


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
