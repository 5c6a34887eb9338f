"""Encoded camera video: one place for demuxing and decoding with PyAV, and for opening an encoder.

Sources are the staged stream of one episode (``bytes``, fragmented MP4), an exported mp4 file (a path), or an
open binary file (a file the viewer pinned at start and must not look up by path again).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import av
import av.container
import numpy as np

from demoforge.storage.scheduling import normal_priority

VideoSource = bytes | str | Path | BinaryIO


def open_encoder(stream: av.video.stream.VideoStream) -> None:
    """Open an output stream's encoder now (its size, format and options set), at normal priority.

    PyAV would open it lazily at the first frame; opened here, inside :func:`normal_priority`, SVT-AV1's threads
    and the calling thread stay out of the real-time class it asks for as root (storage/scheduling.py)."""
    with normal_priority():
        stream.codec_context.open(strict=False)


@contextmanager
def open_video(source: VideoSource) -> Iterator[av.container.InputContainer]:
    if isinstance(source, bytes):
        container = av.open(io.BytesIO(source), mode="r")
    elif isinstance(source, (str, Path)):
        container = av.open(str(source), mode="r")
    else:
        container = av.open(source, mode="r")
    try:
        yield container
    finally:
        container.close()


def count_frames(source: VideoSource) -> int:
    """Frames in the first video stream, counted from its packets (no decoding)."""
    with open_video(source) as container:
        return sum(1 for packet in container.demux(container.streams.video[0]) if packet.size)


def iter_frames(source: VideoSource) -> Iterator[np.ndarray]:
    """Every frame of the first video stream as RGB uint8 (H, W, 3), in presentation order."""
    with open_video(source) as container:
        for frame in container.decode(container.streams.video[0]):
            yield frame.to_ndarray(format="rgb24")


def decode_frames(source: VideoSource) -> np.ndarray:
    """All frames stacked, (N, H, W, 3) uint8; (0, 0, 0, 3) for a stream without frames."""
    frames = list(iter_frames(source))
    return np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8)


def decode_indices(source: VideoSource, indices: Iterable[int]) -> dict[int, np.ndarray]:
    """The frames at these positions. Only those are converted to RGB arrays (the costly step; the codec
    still has to decode the frames they depend on), and decoding stops after the last one wanted."""
    wanted = {int(i) for i in indices}
    out: dict[int, np.ndarray] = {}
    if not wanted:
        return out
    last = max(wanted)
    with open_video(source) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")
            if i >= last:
                break
    return out


def decode_span(source: VideoSource, start_s: float, end_s: float, fps: int,
                pix_fmt: str = "rgb24") -> list[np.ndarray]:
    """The frames shown in ``[start_s, end_s)`` of a file holding several episodes (an exported mp4), seeking
    to the keyframe before ``start_s`` first. Frame times are multiples of 1/fps: half a frame of slack.
    ``pix_fmt="gray12le"`` gives a depth video's 12-bit codes, (H, W) uint16."""
    return [frame.to_ndarray(format=pix_fmt) for frame in decode_span_frames(source, start_s, end_s, fps)]


def decode_span_frames(source: VideoSource, start_s: float, end_s: float, fps: int) -> list[av.VideoFrame]:
    """:func:`decode_span`'s frames as decoded (their own pixel format): what an encoder is fed to re-encode
    them without a colour conversion."""
    half = 0.5 / fps
    out: list[av.VideoFrame] = []
    with open_video(source) as container:
        stream = container.streams.video[0]
        time_base = float(stream.time_base or 0) or 1.0 / fps
        if start_s > 0:
            container.seek(int(max(start_s - 1.0, 0.0) / time_base), stream=stream, backward=True)
        for frame in container.decode(stream):
            t = float(frame.pts or 0) * time_base
            if t < start_s - half:
                continue
            if t >= end_s - half:
                break
            out.append(frame)
    return out
