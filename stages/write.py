"""Write stage: appends each attempt's numbers and encoded bytes to its Zarr staging group, whole chunks
at a time, and opens the attempt's catalog row before any of its data is written.

Buffering happens as records arrive; the blocking I/O (catalog row and arrays of a new attempt, whole
chunks, an attempt's last chunks) runs in one I/O task, in issue order, fed through a bounded queue of
``io_queue`` jobs. So a slow disk or a slow array creation delays only that task, not the stage's intake,
until the queue is full (backpressure as before; memory bounded by the queue: each job holds at most one
chunk per array). Records leave the stage in the order they came.

An attempt's last I/O job also stores its feature statistics (``EpisodeWriter.write_stats``: the numeric
arrays' computed from what was staged, each camera's as its encoder's ``VideoTail`` brought them), so they
are part of its content hash.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.stages.context import StageContext
from demoforge.stages.halves import run_halves
from demoforge.stages.records import (
    AttemptEnded,
    AttemptKey,
    AttemptStarted,
    EncodedFrame,
    EncodedRecord,
    EpisodeAbandoned,
    StagedAttempt,
    StagedRecord,
    VideoTail,
)
from demoforge.storage.faults import attempt_marks
from demoforge.storage.staging import ChunkWrites, EpisodeWriter
from demoforge.storage.store import Store

#: Pending I/O jobs (attempt openings, chunk writes, attempt ends) before the stage stops taking records.
DEFAULT_IO_QUEUE = 8


@dataclass(frozen=True, eq=False)
class _IoJob:
    """Run ``work`` in a worker thread (if any), then send what ``result`` returns (if anything) downstream."""

    work: Callable[[], object] | None = None
    result: Callable[[], StagedRecord] | None = None


def _staged(writer: EpisodeWriter, ended: AttemptEnded) -> StagedAttempt:
    """A committable attempt after its last write: its sizes and digest."""
    return StagedAttempt(ended, writer.video_bytes(), writer.content_hash())


def _same(record: EpisodeAbandoned) -> EpisodeAbandoned:
    return record


def _finish(writer: EpisodeWriter, last: ChunkWrites, cameras: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """A committable attempt's last I/O: its tail chunks, then its statistics."""
    writer.write(last)
    writer.write_stats(cameras)


class _Intake:
    """The stage's first half: each record buffered into its attempt's writer, the I/O it needs queued as jobs
    (a new attempt's opening, its full chunks, its end) or passed on in order."""

    def __init__(self, store: Store, jobs: MemoryObjectSendStream[_IoJob], delay_s: float,
                 mark: Callable[[str], None] | None) -> None:
        self.store, self.jobs, self.delay_s = store, jobs, delay_s
        self.mark = mark  # unset in production: the kill tests' moment "an attempt is mid-episode"
        self.writers: dict[AttemptKey, EpisodeWriter] = {}
        self.camera_stats: dict[AttemptKey, Mapping[str, Mapping[str, np.ndarray]]] = {}
        self.workers: dict[AttemptKey, int] = {}

    async def take(self, record: EncodedRecord) -> None:
        if isinstance(record, AttemptStarted):
            await self._started(record)
        elif isinstance(record, EncodedFrame):
            await self._frame(record)
        elif isinstance(record, VideoTail):
            writer = self.writers[record.key]
            for camera, data in record.video.items():
                writer.add_video(camera, data)
            self.camera_stats[record.key] = record.stats
        elif isinstance(record, AttemptEnded):
            await self._ended(record)
        else:
            await self.jobs.send(_IoJob(result=functools.partial(_same, record)))

    async def _started(self, record: AttemptStarted) -> None:
        key = record.key
        writer = self.writers[key] = self.store.prepare_attempt(key.episode_id)
        await self.jobs.send(_IoJob(functools.partial(
            self.store.begin_attempt, writer, episode_index=key.episode_index, attempt=key.attempt,
            seed=record.seed, row=record.row, worker=record.worker)))
        if self.mark is not None:
            self.workers[key] = record.worker

    async def _frame(self, record: EncodedFrame) -> None:
        writer = self.writers[record.key]
        full = writer.add_frame(record.state, record.action, record.reward, record.annotations.as_tuple())
        for camera, data in record.video.items():
            full |= writer.add_video(camera, data)
        if self.mark is not None and writer.frames == 1:
            self.mark(f"frames {record.key.episode_id} {self.workers.get(record.key, 0)}")
        if full:
            writes = writer.take_full()
            await self.jobs.send(_IoJob(functools.partial(writer.write, writes)))
        if self.delay_s:
            await anyio.sleep(self.delay_s)

    async def _ended(self, record: AttemptEnded) -> None:
        writer = self.writers.pop(record.key)
        if self.mark is not None:
            self.workers.pop(record.key, None)
            self.mark(f"ended {record.key.episode_id}")
        cameras = self.camera_stats.pop(record.key, {})
        if not record.result.keeps_data:
            await self.jobs.send(_IoJob(result=functools.partial(StagedAttempt, record, {}, None)))
            return
        if writer.frames != record.frames:
            raise RuntimeError(f"{record.key.episode_id}: write stage saw {writer.frames} frames, "
                               f"the executor emitted {record.frames}")
        last = writer.take_all()
        await self.jobs.send(_IoJob(functools.partial(_finish, writer, last, cameras),
                                    functools.partial(_staged, writer, record)))


async def _run_io(jobs: MemoryObjectReceiveStream[_IoJob], send: MemoryObjectSendStream[StagedRecord],
                  context: StageContext, stage: anyio.CancelScope) -> None:
    """The stage's second half: run jobs in order; leaves ``jobs`` open on failure (the intake is cancelled, not
    broken)."""
    try:
        async for job in jobs:
            if job.work is not None:
                started = time.perf_counter()
                await anyio.to_thread.run_sync(job.work)
                context.busy.add("write", time.perf_counter() - started)
            if job.result is not None:
                await send.send(job.result())
    except anyio.BrokenResourceError:
        stage.cancel()  # the commit stage is gone: it failed or was cancelled, and reports why itself


async def write_stage(receive: MemoryObjectReceiveStream[EncodedRecord], send: MemoryObjectSendStream[StagedRecord],
                      *, store: Store, context: StageContext | None = None,
                      io_queue: int = DEFAULT_IO_QUEUE) -> None:
    context = context or StageContext()
    delay_s = context.delay("write")
    jobs_send, jobs_recv = anyio.create_memory_object_stream[_IoJob](max(0, io_queue - 1))
    intake = _Intake(store, jobs_send, delay_s, attempt_marks())

    async def take_all() -> None:
        async with jobs_send:
            async for record in receive:
                await intake.take(record)

    async with receive, send, jobs_recv:
        await run_halves(take_all, functools.partial(_run_io, jobs_recv, send, context))
