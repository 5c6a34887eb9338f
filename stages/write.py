"""Write stage: appends each attempt's numbers and encoded bytes to its Zarr staging group, whole chunks
at a time, and opens the attempt's catalog row before any of its data is written."""

from __future__ import annotations

import time

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.pipeline.records import (
    AttemptEnded,
    AttemptKey,
    AttemptStarted,
    EncodedFrame,
    Record,
    StagedAttempt,
    VideoTail,
)
from demoforge.storage.catalog import Catalog
from demoforge.storage.staging import EpisodeWriter, StagingStore


async def write_stage(receive: MemoryObjectReceiveStream[Record], send: MemoryObjectSendStream[Record | StagedAttempt],
                      *, staging: StagingStore, catalog: Catalog, delay_s: float = 0.0,
                      busy: dict[str, float] | None = None) -> None:
    busy = busy if busy is not None else {}
    writers: dict[AttemptKey, EpisodeWriter] = {}
    async with receive, send:
        async for record in receive:
            if isinstance(record, AttemptStarted):
                key = record.key

                def open_attempt(key: AttemptKey = key, rec: AttemptStarted = record) -> EpisodeWriter:
                    catalog.begin_attempt(key.episode_index, key.attempt, key.episode_id, rec.seed, rec.row,
                                          rec.worker)
                    return staging.open_episode(key.episode_id)

                writers[key] = await anyio.to_thread.run_sync(open_attempt)
            elif isinstance(record, EncodedFrame):
                writer = writers[record.key]
                full = writer.add_frame(record.state, record.action, record.reward, record.annotations.as_tuple())
                for camera, data in record.video.items():
                    full |= writer.add_video(camera, data)
                if full:
                    mark = time.perf_counter()
                    await anyio.to_thread.run_sync(writer.flush_full)
                    busy["write"] = busy.get("write", 0.0) + time.perf_counter() - mark
                if delay_s:
                    await anyio.sleep(delay_s)
            elif isinstance(record, VideoTail):
                writer = writers[record.key]
                for camera, data in record.video.items():
                    writer.add_video(camera, data)
            elif isinstance(record, AttemptEnded):
                writer = writers.pop(record.key)
                if record.result.committable:
                    if writer.frames != record.frames:
                        raise RuntimeError(f"{record.key.episode_id}: write stage saw {writer.frames} frames, the "
                                           f"executor emitted {record.frames}")
                    mark = time.perf_counter()
                    sizes = await anyio.to_thread.run_sync(writer.flush_all)
                    busy["write"] = busy.get("write", 0.0) + time.perf_counter() - mark
                    await send.send(StagedAttempt(record, sizes, writer.content_hash()))
                else:
                    await send.send(StagedAttempt(record, {}, None))
            else:
                await send.send(record)
