"""Encode stage: each camera of each attempt is encoded as its frames arrive, into fragmented MP4 bytes.

The bytes flow on to the write stage; nothing is re-encoded later (export remuxes them). Every attempt has
its own encoders, keyed by attempt, so a discarded attempt's video is dropped with it and can never leak
into another episode. Each camera is encoded by its own long-lived thread (PyAV releases the GIL while it
encodes), fed through a bounded queue: see stages/encode_lanes.py.

The encoders of a recorded attempt also keep the pixels LeRobot's episode statistics could sample
(:class:`RecordingEncoder`); when the attempt ends, each camera hands over its last bytes with its statistics
(``storage/sampled_frames.py``), which are committed with the episode, so export never decodes video.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import av
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.stages.context import StageContext
from demoforge.stages.encode_lanes import LaneSet
from demoforge.stages.halves import run_halves
from demoforge.stages.malloc import make_uninitialized_reads_deterministic
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
from demoforge.storage import depth as depth_video
from demoforge.storage.sampled_frames import SampledFrames
from demoforge.storage.schema import CameraSpec
from demoforge.storage.schema import DepthVideoIdentity
from demoforge.storage.video import open_encoder

#: Records the encode stage takes in ahead of what it sent on: how far one camera may run ahead of another.
DEFAULT_LOOKAHEAD = 16

# Fragmented MP4 is written front to back, so it streams into an append-only store without seeking.
FMP4_FLAGS = "frag_keyframe+empty_moov+default_base_moof"


class EncoderError(RuntimeError):
    """The video encoder failed; a durability error: the job stops and reports it."""



def _video_stream(stream: object) -> av.VideoStream:
    """``add_stream`` types its result as any stream kind; a video codec gives a video stream."""
    if not isinstance(stream, av.VideoStream):
        raise EncoderError(f"the codec opened a {type(stream).__name__}, not a video stream")
    return stream


class _Sink:
    """A write-only file object collecting what the muxer emits since the last drain."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def seekable(self) -> bool:
        return False

    def drain(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class CameraEncoder:
    """Encodes one camera of one attempt; :meth:`encode` returns whatever bytes the muxer produced."""

    def __init__(self, camera: CameraSpec, fps: int, settings: VideoSettings) -> None:
        make_uninitialized_reads_deterministic()  # libx264 reads bytes it never wrote: see stages/malloc.py
        self.camera = camera
        self.frames = 0
        self._sink = _Sink()
        try:
            self._container = av.open(self._sink, mode="w", format="mp4", options={"movflags": FMP4_FLAGS})
            self._stream = _video_stream(self._container.add_stream(settings.codec, rate=fps,
                                                                    options=settings.codec_options()))
            self._stream.width = camera.width
            self._stream.height = camera.height
            self._stream.pix_fmt = settings.pix_fmt
            open_encoder(self._stream)
        except Exception as exc:
            raise EncoderError(f"camera {camera.name!r}: cannot open {settings.codec} encoder: {exc}") from exc

    def _video_frame(self, image: np.ndarray) -> av.VideoFrame:
        expected = (self.camera.height, self.camera.width, 3)
        if image.shape != expected:
            raise EncoderError(f"camera {self.camera.name!r}: frame of shape {image.shape}, the job declares "
                               f"{expected}")
        return av.VideoFrame.from_ndarray(image, format="rgb24")

    def encode(self, image: np.ndarray) -> bytes:
        try:
            frame = self._video_frame(image)
            frame.pts = self.frames
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        except EncoderError:
            raise
        except Exception as exc:
            raise EncoderError(f"camera {self.camera.name!r} frame {self.frames}: {exc}") from exc
        self.frames += 1
        return self._sink.drain()

    def finish(self) -> bytes:
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        except Exception as exc:
            raise EncoderError(f"camera {self.camera.name!r}: flushing the encoder failed: {exc}") from exc
        return self._sink.drain()

    def abort(self) -> None:
        try:
            self._container.close()
        except Exception:  # an aborted attempt's video is thrown away; a failing close changes nothing
            pass


class DepthEncoder(CameraEncoder):
    """Encodes one depth camera of one attempt as LeRobot 0.6.1 does: each (H, W) float32 image in metres is
    quantized to 12-bit codes by LeRobot's ``quantize_depth`` and encoded ``gray12le`` with LeRobot's depth
    codec options (HEVC, x265 lossless), so the stored codes are exactly the quantized depth."""

    def __init__(self, camera: CameraSpec, fps: int, identity: DepthVideoIdentity | None = None) -> None:
        make_uninitialized_reads_deterministic()
        self.camera = camera
        self.identity = identity or depth_video.lerobot_depth_identity()
        self.frames = 0
        self._sink = _Sink()
        try:
            self._container = av.open(self._sink, mode="w", format="mp4", options={"movflags": FMP4_FLAGS})
            self._stream = _video_stream(self._container.add_stream(self.identity.codec, rate=fps,
                                                                    options=depth_video.codec_options(self.identity)))
            self._stream.width = camera.width
            self._stream.height = camera.height
            self._stream.pix_fmt = self.identity.pix_fmt
            open_encoder(self._stream)
        except Exception as exc:
            raise EncoderError(f"depth camera {camera.name!r}: cannot open {self.identity.codec} encoder: "
                               f"{exc}") from exc

    def _video_frame(self, image: np.ndarray) -> av.VideoFrame:
        if image.shape != self.camera.shape or image.dtype != np.float32:
            raise EncoderError(f"depth camera {self.camera.name!r}: frame of shape {image.shape} {image.dtype}, "
                               f"the job declares {self.camera.shape} float32")
        return depth_video.quantize(image, self.identity)


def make_encoder(camera: CameraSpec, fps: int, settings: VideoSettings,
                 depth: DepthVideoIdentity | None = None) -> CameraEncoder:
    """The encoder for a camera's kind: RGB by the job's video settings, depth by LeRobot's depth settings."""
    return DepthEncoder(camera, fps, depth) if camera.is_depth else CameraEncoder(camera, fps, settings)


class RecordingEncoder:
    """A camera's encoder for a recorded attempt: each frame is encoded and its pixels that LeRobot's episode
    statistics could sample are kept (in a temporary file under ``stats_dir``); :meth:`finish` hands over the
    last bytes and the statistics of the attempt's frames, computed once its length is known."""

    def __init__(self, encoder: CameraEncoder, stats_dir: Path | None = None) -> None:
        self.camera = encoder.camera
        self._encoder = encoder
        self._frames = SampledFrames(encoder.camera, stats_dir)

    def encode(self, image: np.ndarray) -> bytes:
        data = self._encoder.encode(image)  # checks the frame's shape first
        self._frames.add(image)
        return data

    def finish(self) -> CameraTail:
        try:
            return CameraTail(self._encoder.finish(), self._frames.statistics())
        finally:
            self._frames.close()

    def abort(self) -> None:
        self._encoder.abort()
        self._frames.close()


def make_recording_encoder(camera: CameraSpec, fps: int, settings: VideoSettings,
                           depth: DepthVideoIdentity | None = None,
                           stats_dir: Path | None = None) -> RecordingEncoder:
    """:func:`make_encoder`'s encoder, keeping what the attempt's frame statistics need."""
    return RecordingEncoder(make_encoder(camera, fps, settings, depth), stats_dir)


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
    delay_s = context.delay("encode")
    specs = {c.name: c for c in cameras}
    lanes = LaneSet({name: functools.partial(make_recording_encoder, spec, fps, settings, stats_dir=stats_dir)
                     for name, spec in specs.items()})
    # A frame waits for its lanes' bytes in a slot; every other record passes through in order.
    slots_send, slots_recv = anyio.create_memory_object_stream[
        _FrameSlot | AttemptStarted | AttemptEnded | EpisodeAbandoned](lookahead - 2)

    async def feed() -> None:
        async with slots_send:
            async for record in receive:
                if isinstance(record, Frame):
                    check_cameras(record, specs)
                    lanes.submit_frame(record.key, record.images)
                    await slots_send.send(_FrameSlot(record))
                else:
                    if isinstance(record, AttemptEnded):
                        lanes.submit_end(record.key, keep=record.result.keeps_data)
                    await slots_send.send(record)

    async def emit(stage: anyio.CancelScope) -> None:
        """Send results on in order; leaves slots_recv open on failure (the feeder is cancelled, not broken)."""
        try:
            async for slot in slots_recv:
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

    try:
        async with receive, send, slots_recv:
            await run_halves(feed, emit)
    finally:
        await lanes.close()
