"""Entry point of a worker's encoder process: ``python -m demoforge.stages.encoder_child FD``.

FD is this end of a socket pair to the worker (stages/encoder_process.py), MEMFD the frames' shared memory.
Messages are pickled tuples between the two processes of one worker (never stored): ``("setup", cameras, fps,
video settings, statistics folder, slots, idle)`` once, then ``("frame", key, slot)``, ``("end", key, keep)`` and
``("quit",)``; back: ``("ok", result, busy seconds)`` per job in order, or ``("error", exception)`` once (the lane's own
error, so a full disk stays a ``StorageWriteError``; one that cannot be pickled comes as an ``EncoderError``
naming it).
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
from demoforge.storage.scheduling import idle_process_priority, reset_process_priority


def serve(conn: Connection, memfd: int) -> None:
    """A LaneSet fed from the socket; a second thread sends each job's result back in order."""
    reset_process_priority()  # normal priority whatever the parent's state
    try:
        _, cameras, fps, settings, stats_dir, slots, idle = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    if idle:  # every thread there is (OpenBLAS starts its pool at numpy's import); the lanes and SVT-AV1's own
        idle_process_priority()  # threads, started later, inherit the class
    layout, slot_bytes = frame_layout(cameras)
    buffer = mmap.mmap(memfd, slot_bytes * slots)
    lanes = LaneSet({c.name: functools.partial(make_recording_encoder, c, fps, settings, stats_dir=stats_dir)
                     for c in cameras})
    jobs: queue.SimpleQueue[bool] = queue.SimpleQueue()  # one token per job submitted; False: stop

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

    sender = threading.Thread(target=send_results, name="encoder-results", daemon=True)
    sender.start()
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
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
