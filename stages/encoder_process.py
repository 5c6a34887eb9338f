"""A worker's camera lanes in a process of their own, so encoding never shares the env's process.

Beside the env, the encoders (SVT-AV1's threads, the statistics' sums, PyAV's calls) slow the simulator's
own steps: they contend for its interpreter lock and its process's memory. :class:`EncoderProcess` offers
the blocking half of :class:`~demoforge.stages.encode_lanes.LaneSet` (``submit_frame``, ``submit_end``,
``take_result``, ``shutdown``) and runs a real ``LaneSet`` in a child process: each frame's images are copied
into a slot of anonymous shared memory (a ring of ``slots``, each reused only after its frame's result came
back) and a short message names the slot; results (encoded bytes, each attempt's tail and statistics) come back
over the same socket in job order. The bytes are the lanes' bytes: the same encoders, settings and frame order.

A child that dies surfaces as :class:`EncoderError` at the next result, an encoder failing in it as the lane's
own error (an ``EncoderError``, a ``StorageWriteError`` for a full disk), as it would beside the env; the
child (``python -m demoforge.stages.encoder_child``, a fresh interpreter: it never re-runs the caller's main
module, and never inherits an EGL context) ends when the parent closes it or dies (its socket reaches end of
file).

``idle``: the child's encoding threads run in the ``SCHED_IDLE`` class, so the simulator's renderer preempts
them whenever it wakes (they encode on the CPU it leaves; frames wait in the ring meanwhile). When the worker has
to wait for a result (the ring is full, or it drains at an attempt's end) it tells the child, which raises them
to normal priority until every job submitted has its result: other programs that keep the cores busy slow the
job, as they would at normal priority, but cannot starve it (docs/performance.md, "The encoder process's
priority").
"""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.stages.camera_encoder import EncoderError
from demoforge.stages.encoder_messages import (
    Done,
    EncodeFrame,
    EndAttempt,
    Failed,
    FromChild,
    Hurry,
    Quit,
    Result,
    Setup,
    ToChild,
)
from demoforge.stages.records import AttemptKey
from demoforge.stages.settings import VideoSettings
from demoforge.storage.schema import CameraSpec



def frame_layout(cameras: tuple[CameraSpec, ...]) -> tuple[dict[str, tuple[int, np.dtype[Any]]], int]:
    """Each camera's offset and dtype inside one slot, and the slot's size in bytes."""
    layout: dict[str, tuple[int, np.dtype[Any]]] = {}
    offset = 0
    for camera in cameras:
        dtype = np.dtype(np.float32 if camera.is_depth else np.uint8)
        layout[camera.name] = (offset, dtype)
        offset += int(np.prod(camera.shape)) * dtype.itemsize
    return layout, max(offset, 1)


class EncoderProcess:
    """Camera lanes in a child process; blocking, for one worker's thread (see the module docstring)."""

    def __init__(self, cameras: tuple[CameraSpec, ...], fps: int, settings: VideoSettings, *,
                 stats_dir: Path | None = None, slots: int = 16, idle: bool = False) -> None:
        self._cameras = {c.name: c for c in cameras}
        self._layout, self._slot_bytes = frame_layout(cameras)
        self._slots = slots
        # Anonymous shared memory (memfd): no name to clean up, freed when both processes have closed it.
        self._memfd = os.memfd_create("demoforge-frames")
        os.ftruncate(self._memfd, self._slot_bytes * slots)
        self._buffer = mmap.mmap(self._memfd, self._slot_bytes * slots)
        self._frames = 0  # frames submitted: the next slot is _frames % slots
        self._busy: dict[str, float] = {c.name: 0.0 for c in cameras}
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        # The child imports what this process can: its import path (tests and embedding programs extend it).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        try:
            self._process = subprocess.Popen([sys.executable, "-m", "demoforge.stages.encoder_child",
                                              str(theirs.fileno()), str(self._memfd)],
                                             pass_fds=(theirs.fileno(), self._memfd), env=env,
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        except OSError as exc:
            self._free()
            raise EncoderError(f"cannot start the encoder process: {exc}") from exc
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._closed = False
        self._idle = idle
        self._send(Setup(tuple(cameras), fps, settings, stats_dir, slots, idle))

    @property
    def pid(self) -> int:
        return self._process.pid

    def submit_frame(self, key: AttemptKey, images: Mapping[str, np.ndarray]) -> None:
        slot = self._frames % self._slots
        base = slot * self._slot_bytes
        for name, (offset, dtype) in self._layout.items():
            image = np.asarray(images[name])
            camera = self._cameras[name]
            if image.shape != camera.shape or image.dtype != dtype:
                raise EncoderError(f"camera {name!r}: frame of shape {image.shape} {image.dtype}, the job declares "
                                   f"{camera.shape} {dtype}")
            view: np.ndarray = np.ndarray(camera.shape, dtype, buffer=self._buffer, offset=base + offset)
            view[...] = image
        self._send(EncodeFrame(key, slot))
        self._frames += 1

    def submit_end(self, key: AttemptKey, keep: bool) -> None:
        self._send(EndAttempt(key, keep))

    def take_result(self) -> Result:
        """The next job's result of every camera, in submission order; raises the child's failure."""
        try:
            if self._idle and not self._conn.poll():  # about to wait: the child raises its encoders to normal
                self._conn.send(Hurry())
            message: FromChild = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died() from exc
        match message:
            case Done(result=result, busy=busy):
                self._busy = busy
                return dict(result)
            case Failed(error=error):
                raise error
        raise EncoderError(f"the encoder process sent a {type(message).__name__}, not a result")

    def busy_seconds(self) -> dict[str, float]:
        return dict(self._busy)

    def shutdown(self) -> None:
        """Stop the child (its lanes abort the encoders they hold) and free the shared memory."""
        if self._closed:
            return
        self._closed = True
        try:
            self._conn.send(Quit())
        except OSError:
            pass  # the child is gone already
        try:
            self._process.wait(timeout=60)  # the lanes finish the frame they hold
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        self._conn.close()
        self._free()

    def _free(self) -> None:
        self._buffer.close()
        os.close(self._memfd)

    def _send(self, message: ToChild) -> None:
        try:
            self._conn.send(message)
        except OSError as exc:
            raise self._died() from exc

    def _died(self) -> EncoderError:
        try:
            code: int | None = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return EncoderError(f"the encoder process (pid {self._process.pid}) ended unexpectedly "
                            f"(exit code {code}); the attempt's video is lost")
