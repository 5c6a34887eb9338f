"""Encode stage: each camera of each attempt is encoded as its frames arrive, into fragmented MP4 bytes.

The bytes flow on to the write stage; nothing is re-encoded later (export remuxes them). Every attempt has
its own encoders, keyed by attempt, so a discarded attempt's video is dropped with it and can never leak
into another episode. Encoding runs in worker threads (PyAV releases the GIL), one per camera.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import anyio
import av
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.pipeline.job import VideoSettings
from demoforge.pipeline.malloc import make_uninitialized_reads_deterministic
from demoforge.pipeline.records import AttemptEnded, AttemptKey, EncodedFrame, Frame, Record, VideoTail
from demoforge.pipeline.tasks.registry import CameraSpec
from demoforge.storage import depth as depth_video
from demoforge.storage.schema import DepthVideoIdentity

# Fragmented MP4 is written front to back, so it streams into an append-only store without seeking.
FMP4_FLAGS = "frag_keyframe+empty_moov+default_base_moof"


class EncoderError(RuntimeError):
    """The video encoder failed; a durability error: the job stops and reports it."""


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
        make_uninitialized_reads_deterministic()  # libx264 reads bytes it never wrote: see pipeline/malloc.py
        self.camera = camera
        self.frames = 0
        self._sink = _Sink()
        try:
            self._container = av.open(self._sink, mode="w", format="mp4", options={"movflags": FMP4_FLAGS})
            self._stream = self._container.add_stream(settings.codec, rate=fps, options=settings.codec_options())
            self._stream.width = camera.width
            self._stream.height = camera.height
            self._stream.pix_fmt = settings.pix_fmt
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
            self._stream = self._container.add_stream(self.identity.codec, rate=fps,
                                                      options=depth_video.codec_options(self.identity))
            self._stream.width = camera.width
            self._stream.height = camera.height
            self._stream.pix_fmt = self.identity.pix_fmt
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


async def _map_cameras(fn, items: Mapping[str, object]) -> dict[str, bytes]:
    """Run ``fn(camera, item)`` for every camera concurrently in threads."""
    out: dict[str, bytes] = {}
    if len(items) == 1:
        (name, item), = items.items()
        out[name] = await anyio.to_thread.run_sync(fn, name, item)
        return out

    async def one(name: str, item: object) -> None:
        out[name] = await anyio.to_thread.run_sync(fn, name, item)

    async with anyio.create_task_group() as tg:
        for name, item in items.items():
            tg.start_soon(one, name, item)
    return out


async def encode_stage(receive: MemoryObjectReceiveStream[Record], send: MemoryObjectSendStream[Record], *,
                       cameras: tuple[CameraSpec, ...], fps: int, settings: VideoSettings,
                       delay_s: float = 0.0, busy: dict[str, float] | None = None) -> None:
    """Replace each frame's images by encoded bytes; flush or drop the encoders when an attempt ends."""
    busy = busy if busy is not None else {}
    specs = {c.name: c for c in cameras}
    encoders: dict[AttemptKey, dict[str, CameraEncoder]] = {}
    try:
        async with receive, send:
            async for record in receive:
                if isinstance(record, Frame):
                    if set(record.images) != set(specs):
                        raise EncoderError(f"frame {record.step} of {record.key.episode_id} has cameras "
                                           f"{sorted(record.images)}; the job declares {sorted(specs)}")
                    if record.key not in encoders:
                        encoders[record.key] = await anyio.to_thread.run_sync(
                            lambda: {n: make_encoder(s, fps, settings) for n, s in specs.items()})
                    mine = encoders[record.key]
                    mark = time.perf_counter()
                    video = await _map_cameras(lambda n, img: mine[n].encode(img), record.images)
                    busy["encode"] = busy.get("encode", 0.0) + time.perf_counter() - mark
                    if delay_s:
                        await anyio.sleep(delay_s)
                    await send.send(EncodedFrame(record.key, record.step, record.state, record.action,
                                                 record.reward, record.annotations, video))
                elif isinstance(record, AttemptEnded):
                    mine = encoders.pop(record.key, {})
                    if record.result.committable:
                        tail = await _map_cameras(lambda n, enc: enc.finish(), mine)
                        await send.send(VideoTail(record.key, tail))
                    else:
                        for enc in mine.values():
                            enc.abort()
                    await send.send(record)
                else:
                    await send.send(record)
    finally:
        for mine in encoders.values():
            for enc in mine.values():
                enc.abort()
