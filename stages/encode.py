"""Encode stage: each camera of each attempt is encoded as its frames arrive, into fragmented MP4 bytes.

The bytes flow on to the write stage; nothing is re-encoded later (export remuxes them). Every attempt has
its own encoders, keyed by attempt, so a discarded attempt's video is dropped with it and can never leak
into another episode. Each camera is encoded by its own long-lived thread (PyAV releases the GIL while it
encodes), fed through a bounded queue: see stages/encode_lanes.py.

The encoders (stages/camera_encoder.py) of a recorded attempt also keep the pixels LeRobot's episode
statistics could sample (``RecordingEncoder``); when the attempt ends, each camera hands over its last bytes
with its statistics (``storage/sampled_frames.py``), which are committed with the episode, so export never
decodes video.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.stages.camera_encoder import EncoderError, make_recording_encoder
from demoforge.stages.context import StageContext
from demoforge.stages.encode_lanes_async import AsyncLaneSet
from demoforge.stages.halves import run_halves
from demoforge.stages.records import (
    AttemptEnded,
    AttemptStarted,
    CameraTail,
    EncodedFrame,
    EncodedRecord,
    EpisodeAbandoned,
    Frame,
    Record,
    VideoTail,
)
from demoforge.stages.settings import VideoSettings
from demoforge.storage.schema import CameraSpec

#: Records the encode stage takes in ahead of what it sent on: how far one camera may run ahead of another.
DEFAULT_LOOKAHEAD = 16

LaneResult = Mapping[str, bytes | CameraTail | None]  # one job's result of every camera lane


def check_cameras(frame: Frame, declared: Collection[str]) -> None:
    """A frame carries exactly the job's cameras, or the job stops here with the camera names."""
    if set(frame.images) != set(declared):
        raise EncoderError(f"frame {frame.step} of {frame.key.episode_id} has cameras {sorted(frame.images)}; "
                           f"the job declares {sorted(declared)}")


def encoded_frame(frame: Frame, video: LaneResult) -> EncodedFrame:
    """The frame with its images replaced by each camera's bytes (empty while an encoder buffers)."""
    return EncodedFrame(frame.key, frame.step, frame.state, frame.action, frame.reward, frame.annotations,
                        {name: data if isinstance(data, bytes) else b"" for name, data in video.items()})


def video_tail(ended: AttemptEnded, results: LaneResult) -> VideoTail | None:
    """What a kept attempt's encoders handed over at its end (its last bytes and statistics); None otherwise."""
    if not ended.result.keeps_data:
        return None
    tails = {name: tail for name, tail in results.items() if isinstance(tail, CameraTail)}
    return VideoTail(ended.key, {n: t.data for n, t in tails.items()}, {n: t.stats for n, t in tails.items()})


@dataclass(frozen=True, eq=False)
class _FrameSlot:
    """A frame whose images went to the lanes: what its EncodedFrame needs besides the video."""

    record: Frame


_Slot = _FrameSlot | AttemptStarted | AttemptEnded | EpisodeAbandoned

async def encode_stage(receive: MemoryObjectReceiveStream[Record], send: MemoryObjectSendStream[EncodedRecord], *,
                       cameras: tuple[CameraSpec, ...], fps: int, settings: VideoSettings,
                       context: StageContext | None = None, lookahead: int = DEFAULT_LOOKAHEAD,
                       stats_dir: Path | None = None) -> None:
    """Replace each frame's images by encoded bytes; flush or drop the encoders when an attempt ends.

    Each camera is encoded by its own lane thread (stages/encode_lanes.py), so cameras never wait for each
    other and frames reach the encoders without a thread hop each. Records leave in the order they came.
    At most ``lookahead`` (>= 2) records are taken in and not yet sent on, so a slow consumer stops the
    stage from reading: backpressure and bounded memory as before. The frames kept for the statistics go to
    temporary files in ``stats_dir`` (None: the system's temporary folder).
    """
    if lookahead < 2:
        raise ValueError(f"lookahead must be at least 2 records, got {lookahead}")
    context = context or StageContext()
    specs = {c.name: c for c in cameras}
    lanes = AsyncLaneSet({name: functools.partial(make_recording_encoder, spec, fps, settings,
                                                  stats_dir=stats_dir)
                          for name, spec in specs.items()})
    # A frame waits for its lanes' bytes in a slot; every other record passes through in order.
    slots_send, slots_recv = anyio.create_memory_object_stream[_Slot](lookahead - 2)

    try:
        async with receive, send, slots_recv:
            await run_halves(functools.partial(_feed, receive, slots_send, lanes, specs),
                             functools.partial(_emit, slots_recv, send, lanes, context))
    finally:
        await lanes.close()


async def _feed(receive: MemoryObjectReceiveStream[Record], slots: MemoryObjectSendStream[_Slot],
                lanes: AsyncLaneSet, cameras: Collection[str]) -> None:
    """Each frame's images to the lanes and its slot on; every other record on in order (an attempt's end
    also to the lanes)."""
    async with slots:
        async for record in receive:
            if isinstance(record, Frame):
                check_cameras(record, cameras)
                lanes.submit_frame(record.key, record.images)
                await slots.send(_FrameSlot(record))
            else:
                if isinstance(record, AttemptEnded):
                    lanes.submit_end(record.key, keep=record.result.keeps_data)
                await slots.send(record)


async def _emit(slots: MemoryObjectReceiveStream[_Slot], send: MemoryObjectSendStream[EncodedRecord],
                lanes: AsyncLaneSet, context: StageContext, stage: anyio.CancelScope) -> None:
    """Send results on in order; leaves ``slots`` open on failure (the feeder is cancelled, not broken)."""
    delay_s = context.delay("encode")  # a fault hook: 0 unless a test asks
    try:
        async for slot in slots:
            if isinstance(slot, _FrameSlot):
                video = await lanes.next_result()
                if delay_s:
                    await anyio.sleep(delay_s)
                await send.send(encoded_frame(slot.record, video))
            elif isinstance(slot, AttemptEnded):
                tail = video_tail(slot, await lanes.next_result())
                if tail is not None:
                    await send.send(tail)
                await send.send(slot)
            else:
                await send.send(slot)
            for name, seconds in lanes.busy_seconds().items():
                context.busy.set(f"encode:{name}", seconds)
    except anyio.BrokenResourceError:
        stage.cancel()  # the next stage is gone: it failed or was cancelled, and reports why itself
