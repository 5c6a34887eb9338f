"""Depth video through LeRobot 0.6.1's own depth support: its encoder settings, quantizer and dequantizer.

A depth camera records float32 metres. LeRobot stores depth as 12-bit codes (log quantization between
``depth_min`` and ``depth_max`` with a ``shift``) in ``gray12le`` HEVC, lossless x265, and its reader turns
the codes back into metres. demoforge calls LeRobot's ``quantize_depth`` / ``dequantize_depth`` and takes
its ``DepthEncoderConfig`` for the settings, so a stored depth pixel is exactly what LeRobot would have
written. Importing this module does not import lerobot or torch (each function does, when first called).
"""

from __future__ import annotations

import functools
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


@functools.cache
def lerobot_depth_identity() -> DepthVideoIdentity:
    """LeRobot 0.6.1's default depth encoder (``DepthEncoderConfig()``) as the fingerprint records it."""
    from lerobot.configs.video import DepthEncoderConfig

    config = DepthEncoderConfig()
    extra = dict(config.extra_options)
    if config.vcodec == "hevc":
        params = extra.get("x265-params")
        extra["x265-params"] = f"{params}:{QUIET_X265}" if params else QUIET_X265
    return DepthVideoIdentity(codec=config.vcodec, pix_fmt=config.pix_fmt, g=config.g, crf=config.crf,
                              preset=config.preset, extra_options=extra, depth_min=float(config.depth_min),
                              depth_max=float(config.depth_max), shift=float(config.shift),
                              use_log=bool(config.use_log))


def encoder_config(identity: DepthVideoIdentity):  # -> lerobot.configs.video.DepthEncoderConfig
    """LeRobot's ``DepthEncoderConfig`` for these settings (its ``get_codec_options`` maps them for PyAV)."""
    from lerobot.configs.video import DepthEncoderConfig

    return DepthEncoderConfig(vcodec=identity.codec, pix_fmt=identity.pix_fmt, g=identity.g, crf=identity.crf,
                              preset=identity.preset, extra_options=dict(identity.extra_options),
                              depth_min=identity.depth_min, depth_max=identity.depth_max, shift=identity.shift,
                              use_log=identity.use_log)


def codec_options(identity: DepthVideoIdentity) -> dict[str, str]:
    """PyAV codec options for the depth encoder, exactly as LeRobot maps its config."""
    return encoder_config(identity).get_codec_options(as_strings=True)


def quantize(depth_m: np.ndarray, identity: DepthVideoIdentity) -> av.VideoFrame:
    """A depth image in metres as the ``gray12le`` frame LeRobot's ``quantize_depth`` makes of it."""
    from lerobot.datasets.depth_utils import quantize_depth

    return quantize_depth(depth_m, depth_min=identity.depth_min, depth_max=identity.depth_max,
                          shift=identity.shift, use_log=identity.use_log, pix_fmt=identity.pix_fmt,
                          video_backend="pyav", input_unit=DEPTH_UNIT)


def quantize_codes(depth_m: np.ndarray, identity: DepthVideoIdentity) -> np.ndarray:
    """The 12-bit codes (uint16) LeRobot's ``quantize_depth`` makes of a depth image in metres."""
    from lerobot.datasets.depth_utils import quantize_depth

    return quantize_depth(depth_m, depth_min=identity.depth_min, depth_max=identity.depth_max,
                          shift=identity.shift, use_log=identity.use_log, pix_fmt=identity.pix_fmt,
                          video_backend=None, input_unit=DEPTH_UNIT)


def dequantize(codes: np.ndarray, identity: DepthVideoIdentity) -> np.ndarray:
    """Metres (float32, same shape as ``codes``) from 12-bit codes, by LeRobot's ``dequantize_depth``."""
    from lerobot.datasets.depth_utils import dequantize_depth

    array = np.asarray(codes)
    array = array[..., None] if array.ndim >= 3 else array  # (N, H, W) -> (N, H, W, 1): lerobot's layout
    metres = dequantize_depth(array, depth_min=identity.depth_min, depth_max=identity.depth_max,
                              shift=identity.shift, use_log=identity.use_log, pix_fmt=identity.pix_fmt,
                              output_unit=DEPTH_UNIT, output_tensor=False, output_channel_last=True)
    return np.asarray(metres)[..., 0]


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
