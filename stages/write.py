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


async def write_stage(receive: MemoryObjectReceiveStream[EncodedRecord], send: MemoryObjectSendStream[StagedRecord],
                      *, store: Store, context: StageContext | None = None,
                      io_queue: int = DEFAULT_IO_QUEUE) -> None:
    context = context or StageContext()
    delay_s = context.delay("write")
    writers: dict[AttemptKey, EpisodeWriter] = {}
    camera_stats: dict[AttemptKey, Mapping[str, Mapping[str, np.ndarray]]] = {}
    jobs_send, jobs_recv = anyio.create_memory_object_stream[_IoJob](max(0, io_queue - 1))
    mark = attempt_marks()  # unset in production: the kill tests' moment "an attempt is mid-episode"
    workers: dict[AttemptKey, int] = {}

    async def intake() -> None:
        async with jobs_send:
            async for record in receive:
                if isinstance(record, AttemptStarted):
                    key = record.key
                    writer = writers[key] = store.prepare_attempt(key.episode_id)
                    await jobs_send.send(_IoJob(functools.partial(
                        store.begin_attempt, writer, episode_index=key.episode_index, attempt=key.attempt,
                        seed=record.seed, row=record.row, worker=record.worker)))
                    if mark is not None:
                        workers[key] = record.worker
                elif isinstance(record, EncodedFrame):
                    writer = writers[record.key]
                    full = writer.add_frame(record.state, record.action, record.reward,
                                            record.annotations.as_tuple())
                    for camera, data in record.video.items():
                        full |= writer.add_video(camera, data)
                    if mark is not None and writer.frames == 1:
                        mark(f"frames {record.key.episode_id} {workers.get(record.key, 0)}")
                    if full:
                        writes = writer.take_full()
                        await jobs_send.send(_IoJob(functools.partial(writer.write, writes)))
                    if delay_s:
                        await anyio.sleep(delay_s)
                elif isinstance(record, VideoTail):
                    writer = writers[record.key]
                    for camera, data in record.video.items():
                        writer.add_video(camera, data)
                    camera_stats[record.key] = record.stats
                elif isinstance(record, AttemptEnded):
                    writer = writers.pop(record.key)
                    if mark is not None:
                        workers.pop(record.key, None)
                        mark(f"ended {record.key.episode_id}")
                    cameras = camera_stats.pop(record.key, {})
                    if record.result.keeps_data:
                        if writer.frames != record.frames:
                            raise RuntimeError(f"{record.key.episode_id}: write stage saw {writer.frames} frames, "
                                               f"the executor emitted {record.frames}")
                        last = writer.take_all()
                        await jobs_send.send(_IoJob(functools.partial(_finish, writer, last, cameras),
                                                    functools.partial(_staged, writer, record)))
                    else:
                        await jobs_send.send(_IoJob(result=functools.partial(StagedAttempt, record, {}, None)))
                else:
                    await jobs_send.send(_IoJob(result=functools.partial(_same, record)))

    async def run_io(stage: anyio.CancelScope) -> None:
        """Run jobs in order; leaves jobs_recv open on failure (the intake is cancelled, not broken)."""
        try:
            async for job in jobs_recv:
                if job.work is not None:
                    mark = time.perf_counter()
                    await anyio.to_thread.run_sync(job.work)
                    context.busy.add("write", time.perf_counter() - mark)
                if job.result is not None:
                    await send.send(job.result())
        except anyio.BrokenResourceError:
            stage.cancel()  # the commit stage is gone: it failed or was cancelled, and reports why itself

    async with receive, send, jobs_recv:
        await run_halves(intake, run_io)
