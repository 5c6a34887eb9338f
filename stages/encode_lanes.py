"""Camera lanes: one long-lived thread per camera owns every encoder of that camera and works through its
own queue, so cameras of a frame encode independently and no frame costs a thread hand-off.

A caller only appends jobs to the lanes' queues (a lock and a list append) and collects results in job
order: a worker's thread blocks in :meth:`LaneSet.take_result` (stages/record_encoder.py, the encoder process),
an event loop awaits ``AsyncLaneSet.next_result`` (stages/encode_lanes_async.py): one encoder lifecycle for
every executor. Jobs of one lane run in submission order, so each camera's frames are encoded in exact order,
and the i-th result of every lane belongs to the i-th job. This module imports no event loop, so the encoder
process starts in less time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from demoforge.stages.records import AttemptKey, CameraTail


class Encoder(Protocol):
    """What a lane needs of one camera's encoder for one attempt (``CameraEncoder`` and its siblings)."""

    def encode(self, image: np.ndarray) -> bytes: ...

    def finish(self) -> CameraTail: ...

    def abort(self) -> None: ...


@dataclass(frozen=True, eq=False)
class _Job:
    """Encode ``image`` (kind "frame"), or end the attempt: flush its encoder ("keep") or drop it ("drop")."""

    kind: str
    key: AttemptKey
    image: np.ndarray | None = None


class _Lane:
    """One camera: a thread running its jobs in order, keeping one encoder per attempt."""

    def __init__(self, name: str, make_encoder: Callable[[], Encoder], hub: LaneSet) -> None:
        self.name = name
        self._make_encoder = make_encoder
        self._hub = hub
        self._inbox: deque[_Job] = deque()
        self._has_work = threading.Condition(hub.lock)
        self.results: deque[bytes | CameraTail | None] = deque()
        self._encoders: dict[AttemptKey, Encoder] = {}
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"encode-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, job: _Job) -> None:
        """Queue a job (caller holds the hub's lock)."""
        self._inbox.append(job)
        if len(self._inbox) == 1:
            self._has_work.notify()

    def wake(self) -> None:
        """Let a waiting lane see ``hub.closing`` (caller holds the hub's lock)."""
        self._has_work.notify()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        hub = self._hub
        try:
            while True:
                with hub.lock:
                    while not self._inbox and not hub.closing:
                        self._has_work.wait()
                    if hub.closing:
                        return
                    batch = list(self._inbox)
                    self._inbox.clear()
                for job in batch:
                    if hub.closing:
                        return
                    mark = time.perf_counter()
                    out = self._do(job)
                    self.busy_s += time.perf_counter() - mark
                    hub.deliver(self, out)
        except BaseException as exc:  # an encoder failure (EncoderError) or a bug: the stage re-raises it
            hub.fail(exc)
        finally:
            # Whatever is left belongs to no committable attempt. A failing clean-up (a full disk) is reported
            # like any failure, never escapes the thread: the first failure is what the stage raises.
            for encoder in self._encoders.values():
                try:
                    encoder.abort()
                except BaseException as exc:
                    hub.fail(exc)
            self._encoders.clear()

    def _do(self, job: _Job) -> bytes | CameraTail | None:
        if job.kind == "frame":
            encoder = self._encoders.get(job.key)
            if encoder is None:
                encoder = self._encoders[job.key] = self._make_encoder()
            assert job.image is not None
            return encoder.encode(job.image)
        encoder = self._encoders.pop(job.key, None)
        if encoder is None:  # an attempt that ended before its first frame
            return None
        if job.kind == "keep":
            return encoder.finish()
        encoder.abort()
        return None


class LaneSet:
    """The camera lanes of one worker or stage, with the results they have ready. Submitting never blocks."""

    def __init__(self, makers: Mapping[str, Callable[[], Encoder]]) -> None:
        self.lock = threading.Lock()
        self.closing = False
        self._error: BaseException | None = None
        self._submitted = 0  # jobs given to every lane
        self._taken = 0  # jobs whose results were taken
        self._want: int | None = None  # results per lane an asynchronous taker waits for
        self._notify: Callable[[], None] | None = None  # wakes that taker (stages/encode_lanes_async.py)
        self._changed = threading.Condition(self.lock)  # a result or a failure arrived (blocking takers)
        self.lanes = {name: _Lane(name, make, self) for name, make in makers.items()}
        for lane in self.lanes.values():
            lane.start()

    # ---------------------------------------------------------------------------------- taker side
    def submit_frame(self, key: AttemptKey, images: Mapping[str, np.ndarray]) -> None:
        with self.lock:
            for name, lane in self.lanes.items():
                lane.put(_Job("frame", key, images[name]))
            self._submitted += 1

    def submit_end(self, key: AttemptKey, keep: bool) -> None:
        with self.lock:
            job = _Job("keep" if keep else "drop", key)
            for lane in self.lanes.values():
                lane.put(job)
            self._submitted += 1

    def take_result(self) -> dict[str, bytes | CameraTail | None]:
        """The next job's result of every lane, in submission order: waits for it; raises a lane's failure."""
        with self.lock:
            while True:
                self._raise_if_failed()
                if self._ready() > 0:
                    return self._take()
                self._changed.wait()

    def shutdown(self) -> None:
        """Stop every lane (each aborts the encoders it still holds) and wait for their threads."""
        with self.lock:
            self.closing = True
            for lane in self.lanes.values():
                lane.wake()
        for lane in self.lanes.values():
            lane.join(timeout=60)  # a lane finishes the frame it is encoding, then stops

    def busy_seconds(self) -> dict[str, float]:
        return {name: lane.busy_s for name, lane in self.lanes.items()}

    # --------------------------------------------------------------------------------- lane side
    def deliver(self, lane: _Lane, out: bytes | CameraTail | None) -> None:
        with self.lock:
            lane.results.append(out)
            self._changed.notify_all()
            if self._want is not None and self._ready() >= self._want:
                self._wake()

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self._error is None:
                self._error = exc
            self._changed.notify_all()
            self._wake()

    # ------------------------------------------------------------------------------------ shared
    def _ready(self) -> int:
        """Jobs whose result every lane has delivered (with no camera, every job submitted and not yet taken)."""
        return min((len(lane.results) for lane in self.lanes.values()), default=self._submitted - self._taken)

    def _wake(self) -> None:
        if self._notify is not None:
            self._notify()
            self._want = self._notify = None

    def _take(self) -> dict[str, bytes | CameraTail | None]:
        """The next job's result of every lane (caller holds the lock and knows they are ready)."""
        self._taken += 1
        return {name: lane.results.popleft() for name, lane in self.lanes.items()}

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
