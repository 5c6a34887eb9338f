"""Depth video as LeRobot 0.6.1 stores it: its encoder settings, quantizer and dequantizer.

A depth camera records float32 metres. LeRobot stores depth as 12-bit codes (log quantization between
``depth_min`` and ``depth_max`` with a ``shift``) in ``gray12le`` HEVC, lossless x265, and its reader turns
the codes back into metres. The settings (``DepthEncoderConfig()``'s defaults and its codec options) and the
arithmetic of ``quantize_depth`` / ``dequantize_depth`` (float32, the same operations in the same order) are
written out here, because importing ``lerobot.configs`` or ``lerobot.datasets`` costs seconds of torch imports
in every process that records, reads or checks depth. ``tests/test_depth_parity.py`` compares each with
LeRobot's own, bit for bit, so a stored depth pixel is exactly what LeRobot would have written.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator

import av
import numpy as np

from demoforge.storage.schema import DepthVideoIdentity
from demoforge.storage.video import VideoSource, open_video

#: x265 prints a banner and a summary per encoder on stderr; quiet it. Only logging: the codes are lossless.
QUIET_X265 = "log-level=error"
DEPTH_UNIT = "m"  # what a depth camera records, and the ``depth_unit`` of the exported feature
#: Near and far of the colour map as percentiles of an episode's depth: robust, so a far background does not
#: flatten the scene. ``inspect --plot`` and ``demoforge view`` colour depth the same way.
COLOUR_PERCENTILES = (1.0, 90.0)
#: The largest 12-bit code (``lerobot.configs.video.DEPTH_QMAX``).
DEPTH_QMAX = 4095


class DepthSettingsError(ValueError):
    """Depth quantizer settings LeRobot refuses (log quantization needs ``depth_min + shift > 0``)."""


@functools.cache
def lerobot_depth_identity() -> DepthVideoIdentity:
    """LeRobot 0.6.1's default depth encoder (``DepthEncoderConfig()``) as the fingerprint records it, with
    x265's logging quieted."""
    return DepthVideoIdentity(codec="hevc", pix_fmt="gray12le", g=2, crf=30, preset=None,
                              extra_options={"x265-params": f"lossless=1:{QUIET_X265}"}, depth_min=0.01,
                              depth_max=10.0, shift=3.5, use_log=True)


def codec_options(identity: DepthVideoIdentity) -> dict[str, str]:
    """PyAV codec options for the depth encoder, as LeRobot's ``get_codec_options(as_strings=True)`` maps an
    HEVC or h264 config: ``g``, then ``crf`` and ``preset`` where set, then the extra options that do not
    override those."""
    if identity.codec not in ("hevc", "h264"):
        raise DepthSettingsError(f"depth codec {identity.codec!r}: only hevc and h264 are mapped")
    opts = {"g": str(identity.g)}
    for key, value in (("crf", identity.crf), ("preset", identity.preset)):
        if value is not None:
            opts[key] = str(value)
    for key, value in identity.extra_options.items():
        if key not in opts and value is not None:
            opts[key] = str(value)
    return opts


def _check_log(identity: DepthVideoIdentity) -> None:
    if identity.use_log and identity.depth_min + identity.shift <= 0:
        raise DepthSettingsError(f"depth_min + shift must be positive for logarithmic quantization, got "
                                 f"depth_min={identity.depth_min} + shift={identity.shift}")


def quantize_codes(depth_m: np.ndarray, identity: DepthVideoIdentity) -> np.ndarray:
    """The 12-bit codes (uint16) LeRobot's ``quantize_depth`` makes of a depth image in metres."""
    _check_log(identity)
    depth = np.asarray(depth_m)
    if depth.ndim == 3 and (depth.shape[0] == 1 or depth.shape[-1] == 1):  # one channel, first or last
        depth = depth[0] if depth.shape[0] == 1 else depth[..., 0]
    depth = depth.astype(np.float32, order="K")
    low, high, shift = np.float32(identity.depth_min), np.float32(identity.depth_max), np.float32(identity.shift)
    norm: np.ndarray
    if identity.use_log:
        log_min, log_max = math.log(float(low + shift)), math.log(float(high + shift))
        norm = (np.log(depth + shift) - log_min) / (log_max - log_min)
    else:
        norm = (depth - low) / (high - low)
    return np.rint(norm * DEPTH_QMAX).clip(0, DEPTH_QMAX).astype(np.uint16, copy=False)


def quantize(depth_m: np.ndarray, identity: DepthVideoIdentity) -> av.VideoFrame:
    """A depth image in metres as the ``gray12le`` frame LeRobot's ``quantize_depth`` makes of it."""
    codes = quantize_codes(depth_m, identity)
    frame = av.VideoFrame.from_ndarray(codes, format=identity.pix_fmt)
    plane = frame.planes[0]  # rows are padded past the width: write each row's pixels only
    height, width = codes.shape
    rows = np.frombuffer(plane, dtype=np.uint16).reshape(height, plane.line_size // 2)
    rows[:, :width] = codes
    return frame


def dequantize(codes: np.ndarray, identity: DepthVideoIdentity) -> np.ndarray:
    """Metres (float32, same shape as ``codes``) from 12-bit codes, as LeRobot's ``dequantize_depth``."""
    _check_log(identity)
    low, high, shift = float(identity.depth_min), float(identity.depth_max), float(identity.shift)
    if identity.use_log:
        offset = math.log(low + shift)
        scale = (math.log(high + shift) - offset) / DEPTH_QMAX
    else:
        offset, scale = low, (high - low) / DEPTH_QMAX
    array = np.asarray(codes)
    metres = np.empty(array.shape, dtype=np.float32)
    np.multiply(array, scale, out=metres)
    np.add(metres, offset, out=metres)
    if identity.use_log:
        np.exp(metres, out=metres)
        np.subtract(metres, shift, out=metres)
    np.clip(metres, low, high, out=metres)
    return metres


def iter_codes(source: VideoSource, pix_fmt: str = "gray12le") -> Iterator[np.ndarray]:
    """Every frame of a depth video as its 12-bit codes, (H, W) uint16, in presentation order."""
    with open_video(source) as container:
        for frame in container.decode(container.streams.video[0]):
            yield frame.to_ndarray(format=pix_fmt)


def decode_codes(source: VideoSource, indices: Iterable[int] | None = None) -> dict[int, np.ndarray]:
    """The codes of the frames at ``indices`` (all frames when None); decoding stops after the last wanted."""
    wanted = None if indices is None else {int(i) for i in indices}
    out: dict[int, np.ndarray] = {}
    if wanted is not None and not wanted:
        return out
    last = None if wanted is None else max(wanted)
    for i, codes in enumerate(iter_codes(source)):
        if wanted is None or i in wanted:
            out[i] = codes
        if last is not None and i >= last:
            break
    return out


def colourise(depth_m: np.ndarray, near: float | None = None, far: float | None = None) -> np.ndarray:
    """An (H, W, 3) uint8 picture of a depth image: near is yellow, far is dark blue (viridis-like)."""
    depth = np.asarray(depth_m, dtype=np.float32)
    near = float(np.min(depth)) if near is None else near
    far = float(np.max(depth)) if far is None else far
    t = np.clip((depth - near) / max(far - near, 1e-6), 0.0, 1.0)
    stops = np.array([[253, 231, 37], [94, 201, 98], [33, 145, 140], [59, 82, 139], [68, 1, 84]], np.float32)
    x = np.linspace(0.0, 1.0, len(stops))
    return np.stack([np.interp(t, x, stops[:, c]) for c in range(3)], axis=-1).round().astype(np.uint8)
