"""Entry point of a worker's encoder process: ``python -m demoforge.stages.encoder_child FD``.

FD is this end of a socket pair to the worker (stages/encoder_process.py), MEMFD the frames' shared memory.
The messages are stages/encoder_messages.py's; an encoder's error that cannot be pickled comes back as an
``EncoderError`` naming it.
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
import numpy as np

from demoforge.stages.camera_encoder import EncoderError, make_recording_encoder
from demoforge.stages.encode_lanes import LaneSet
from demoforge.stages.encoder_messages import (
    Done,
    EncodeFrame,
    EndAttempt,
    Failed,
    FromChild,
    Hurry,
    Setup,
    ToChild,
)
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


class _FrameSlots:
    """The frames' shared memory, as each camera's image in a slot."""

    def __init__(self, setup: Setup, memfd: int) -> None:
        self.cameras = setup.cameras
        self.layout, self.slot_bytes = frame_layout(setup.cameras)
        self.buffer = mmap.mmap(memfd, self.slot_bytes * setup.slots)

    def images(self, slot: int) -> dict[str, np.ndarray]:
        base = slot * self.slot_bytes
        return {c.name: np.ndarray(c.shape, self.layout[c.name][1], buffer=self.buffer,
                                   offset=base + self.layout[c.name][0]) for c in self.cameras}


def serve(conn: Connection, memfd: int) -> None:
    """A LaneSet fed from the socket; a second thread sends each job's result back in order."""
    reset_process_priority()  # normal priority whatever the parent's state
    try:
        setup = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    if not isinstance(setup, Setup):
        raise TypeError(f"the encoder process expects Setup first, got {type(setup).__name__}")
    frames = _FrameSlots(setup, memfd)
    lanes = LaneSet({c.name: functools.partial(make_recording_encoder, c, setup.fps, setup.settings,
                                               stats_dir=setup.stats_dir) for c in setup.cameras})
    jobs: queue.SimpleQueue[bool] = queue.SimpleQueue()  # one token per job submitted; False: stop
    # Lowers every thread but this one (OpenBLAS's pool, the lanes); SVT-AV1's threads, started later by a lane,
    # inherit its class.
    priority = EncoderPriority({threading.get_native_id()}) if setup.idle else None
    sender = threading.Thread(target=_send_results, args=(conn, lanes, jobs, priority), name="encoder-results",
                              daemon=True)
    sender.start()
    if priority is not None and sender.native_id is not None:
        priority.spare(sender.native_id)  # started by this thread: normal already
    try:
        _submit_jobs(conn, lanes, frames, jobs, priority)
    finally:
        jobs.put(False)
        lanes.shutdown()  # each lane finishes its frame and aborts the encoders it holds
        # No interpreter teardown: the lanes are stopped, and a result sender still waiting for a job the
        # parent no longer wants (it quit mid-attempt) has nothing to flush.
        os._exit(0)


def _submit_jobs(conn: Connection, lanes: LaneSet, frames: _FrameSlots, jobs: queue.SimpleQueue[bool],
                 priority: EncoderPriority | None) -> None:
    """The worker's messages, until it quits or is gone: frames and ends to the lanes, hurries to the priority."""
    while True:
        try:
            message: ToChild = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if priority is not None and isinstance(message, (EncodeFrame, EndAttempt)):
            priority.submitted()  # before the job reaches the lanes: its result cannot come back first
        match message:
            case EncodeFrame(key=key, slot=slot):
                lanes.submit_frame(key, frames.images(slot))
                jobs.put(True)
            case EndAttempt(key=key, keep=keep):
                lanes.submit_end(key, keep)
                jobs.put(True)
            case Hurry():
                if priority is not None:
                    priority.hurry()
            case _:
                return  # Quit


def _send_results(conn: Connection, lanes: LaneSet, jobs: queue.SimpleQueue[bool],
                  priority: EncoderPriority | None) -> None:
    """Each job's result, in order, until the reader stops or an encoder fails (that error goes back once)."""
    while jobs.get():
        message: FromChild
        try:
            message = Done(lanes.take_result(), lanes.busy_seconds())
        except BaseException as exc:  # an encoder failed: the parent raises the same error at this result
            message = Failed(exc)
        try:
            try:
                conn.send(message)
            except (pickle.PicklingError, TypeError, AttributeError):  # an error that cannot cross: named
                failure = message.error if isinstance(message, Failed) else message.result
                conn.send(Failed(EncoderError(f"{type(failure).__name__}: {failure}")))
        except OSError:
            return  # the parent is gone; the main loop sees it too
        if isinstance(message, Failed):
            return
        if priority is not None:
            priority.settle()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
