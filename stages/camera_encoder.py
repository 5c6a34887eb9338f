"""One camera's encoder for one attempt: frames in, fragmented MP4 bytes out (RGB by the job's video
settings, depth by LeRobot's depth settings), and, for a recorded attempt, the pixels its statistics need.

The encode stage (stages/encode.py), a worker's lanes (stages/record_encoder.py) and the encoder process
(stages/encoder_child.py) all make their encoders here. This module imports no event loop and no gymnasium,
so the encoder process starts in less time.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from demoforge.stages.malloc import make_uninitialized_reads_deterministic
from demoforge.stages.records import CameraTail
from demoforge.stages.settings import VideoSettings
from demoforge.storage import depth as depth_video
from demoforge.storage.sampled_frames import SampledFrames
from demoforge.storage.schema import CameraSpec, DepthVideoIdentity
from demoforge.storage.video import open_encoder

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
        self._open(camera, fps, settings.codec, settings.codec_options(), settings.pix_fmt, "camera")

    def _open(self, camera: CameraSpec, fps: int, codec: str, options: dict[str, str], pix_fmt: str,
              kind: str) -> None:
        """Open the muxer and the codec (``kind`` names the camera in errors: "camera", "depth camera")."""
        make_uninitialized_reads_deterministic()  # libx264 reads bytes it never wrote: see stages/malloc.py
        self.camera = camera
        self.frames = 0
        self._sink = _Sink()
        try:
            self._container = av.open(self._sink, mode="w", format="mp4", options={"movflags": FMP4_FLAGS})
            self._stream = _video_stream(self._container.add_stream(codec, rate=fps, options=options))
            self._stream.width = camera.width
            self._stream.height = camera.height
            self._stream.pix_fmt = pix_fmt
            open_encoder(self._stream)
        except Exception as exc:
            raise EncoderError(f"{kind} {camera.name!r}: cannot open {codec} encoder: {exc}") from exc

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
        self.identity = identity or depth_video.lerobot_depth_identity()
        self._open(camera, fps, self.identity.codec, depth_video.codec_options(self.identity), self.identity.pix_fmt,
                   "depth camera")

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
