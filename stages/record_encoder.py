"""A worker's own encoders: the executor's records become encoded records in the worker that made them.

Every executor runs it (env threads in stages/step.py, process workers and Ray actors in
pipeline/workers/episode_worker.py), so a frame takes one route whatever the executor:
executor -> :class:`RecordEncoder` -> write -> commit. The camera lanes (stages/encode_lanes.py) encode while
the env computes the next steps (PyAV and MuJoCo release the GIL); the env runs at most ``lag`` encoder jobs
ahead of them, and records leave in the order the executor made them.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from pathlib import Path

from demoforge.stages.camera_encoder import make_recording_encoder
from demoforge.stages.context import StageContext
from demoforge.stages.encode import check_cameras, encoded_frame, video_tail
from demoforge.stages.encode_lanes import LaneSet
from demoforge.stages.encoder_process import EncoderProcess
from demoforge.stages.records import AttemptEnded, EncodedRecord, Frame, Record
from demoforge.stages.settings import VideoSettings
from demoforge.storage.schema import CameraSpec

#: Encoder jobs (frames, attempt ends) a worker may run ahead of its encoders before it waits for them.
DEFAULT_ENCODE_LAG = 8


class RecordEncoder:
    """Encodes one worker's frames through its own camera lanes; blocking, for the worker's thread.

    :meth:`feed` takes the executor's next record and returns the records now complete, in order;
    :meth:`drain` waits for all of them. After an exception inside an attempt, :meth:`reset` drops what is
    pending and starts fresh lanes (the old ones abort their encoders). ``context``: the job's stop flag and its
    ``encode`` delay (the crash tests' fault: it slows each encoded frame; none by default). ``apart``: the lanes
    run in a process of their own (stages/encoder_process.py), not beside the env (a job without cameras starts
    none); ``idle``: that process's encoders run at idle priority, raised while this worker waits for them
    (EncoderProcess)."""

    def __init__(self, cameras: tuple[CameraSpec, ...], fps: int, settings: VideoSettings, *,
                 stats_dir: Path | None = None, lag: int = DEFAULT_ENCODE_LAG, context: StageContext | None = None,
                 apart: bool = False, idle: bool = False) -> None:
        if lag < 0:
            raise ValueError(f"lag must be >= 0 encoder jobs, got {lag}")
        self._makers = {c.name: functools.partial(make_recording_encoder, c, fps, settings, stats_dir=stats_dir)
                        for c in cameras}
        self._new_lanes: Callable[[], LaneSet | EncoderProcess]
        if apart and cameras:
            self._new_lanes = functools.partial(EncoderProcess, cameras, fps, settings, stats_dir=stats_dir,
                                                slots=lag + 2, idle=idle)
        else:
            self._new_lanes = functools.partial(LaneSet, self._makers)
        self.lag = lag
        context = context or StageContext()
        self._delay_s = context.delay("encode")
        self._stop = context.stop
        self.lanes: LaneSet | EncoderProcess = self._new_lanes()
        self._pending: deque[Record] = deque()  # in the executor's order; frames and ends are lane jobs
        self._jobs = 0  # lane jobs in _pending

    def feed(self, record: Record) -> list[EncodedRecord]:
        if isinstance(record, Frame):
            check_cameras(record, self._makers)
            self.lanes.submit_frame(record.key, record.images)
            self._jobs += 1
        elif isinstance(record, AttemptEnded):
            self.lanes.submit_end(record.key, keep=record.result.keeps_data)
            self._jobs += 1
        self._pending.append(record)
        return self._resolve(self.lag)

    def drain(self) -> list[EncodedRecord]:
        return self._resolve(0)

    def _resolve(self, keep: int) -> list[EncodedRecord]:
        out: list[EncodedRecord] = []
        pending = self._pending
        while pending and (self._jobs > keep or not isinstance(pending[0], (Frame, AttemptEnded))):
            record = pending.popleft()
            if isinstance(record, Frame):
                self._jobs -= 1
                video = self.lanes.take_result()
                if self._delay_s:
                    self._stop.wait(self._delay_s)
                out.append(encoded_frame(record, video))
            elif isinstance(record, AttemptEnded):
                self._jobs -= 1
                tail = video_tail(record, self.lanes.take_result())
                if tail is not None:
                    out.append(tail)
                out.append(record)
            else:
                out.append(record)
        return out

    def reset(self) -> None:
        """Drop every pending record; fresh lanes replace the old ones (which abort their encoders)."""
        self._pending.clear()
        self._jobs = 0
        self.lanes.shutdown()
        self.lanes = self._new_lanes()

    def busy_seconds(self) -> dict[str, float]:
        return self.lanes.busy_seconds()

    def close(self) -> None:
        """Stop the lanes; encoders of attempts still open are aborted."""
        self.lanes.shutdown()
