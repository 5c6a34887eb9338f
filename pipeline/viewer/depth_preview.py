"""A depth camera as a video a browser plays: the episode's 12-bit depth codes, in metres, colour-mapped and
encoded as H.264.

Depth is stored as lossless ``gray12le`` HEVC (LeRobot's depth settings), which Chromium does not play. The
preview is the picture ``inspect --plot`` draws (``storage.depth.colourise``: near is yellow, far is dark
blue), with one near/far range for the whole episode so a colour means the same distance in every frame; the
page prints that range next to the camera. Frame ``i`` is shown at ``i / fps``, as in the RGB videos.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from demoforge.storage.depth import COLOUR_PERCENTILES, colourise, dequantize
from demoforge.storage.schema import DepthVideoIdentity

CODES = 1 << 12  # gray12le: codes 0..4095
PRESET = "fast"
CRF = 12  # colours a person reads distances from: within ~8 of the colour map away from edges; ~1.6 kB a 224x224 frame
GOP = 12  # a keyframe every 12 frames: seeking decodes at most 11 frames


@dataclass(frozen=True)
class DepthPreview:
    """A colour-mapped depth video (mp4, H.264) and the distances its colours span."""

    mp4: bytes
    frames: int
    near_m: float  # shown as the colour map's first colour (yellow); nearer is clipped to it
    far_m: float  # shown as its last colour (dark blue); farther is clipped to it


def colour_range(codes: np.ndarray, identity: DepthVideoIdentity) -> tuple[float, float]:
    """Near and far (metres) of an episode's codes, at :data:`COLOUR_PERCENTILES` of its pixels.

    Pixels at the first or last code (nearer than ``depth_min``, or no surface within ``depth_max``: the sky
    behind a table scene) are left out, so they do not stretch the range; they show as near or far. A
    histogram of the 4096 codes gives the percentiles exactly and cheaply: dequantizing is monotonic, so the
    percentile of the metres is the metres of the percentile code."""
    counts = np.bincount(np.asarray(codes, np.uint16).ravel(), minlength=CODES)
    inside = counts.copy()
    inside[0] = inside[CODES - 1] = 0
    if inside.any():
        counts = inside
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    picks = [int(np.searchsorted(cumulative, max(p / 100.0 * total, 1), side="left")) for p in COLOUR_PERCENTILES]
    near, far = dequantize(np.array(picks, np.uint16), identity).tolist()
    return float(near), float(far)


def colour_table(identity: DepthVideoIdentity, near: float, far: float) -> np.ndarray:
    """(4096, 3) uint8: the colour of every code. Dequantizing and colourising act pixel by pixel, so looking
    codes up here is exactly ``colourise(dequantize(codes), near, far)``, at a fraction of the cost."""
    metres = dequantize(np.arange(CODES, dtype=np.uint16), identity)
    return colourise(metres, near, far)


def encode_preview(codes: np.ndarray, identity: DepthVideoIdentity, fps: int) -> DepthPreview:
    """``codes``: one episode's depth codes, (frames, H, W) uint16. Odd sizes are padded by repeating the last
    row or column (yuv420p needs even ones)."""
    codes = np.asarray(codes)
    if codes.ndim != 3 or len(codes) == 0:
        raise ValueError(f"expected depth codes shaped (frames, height, width), got {codes.shape}")
    near, far = colour_range(codes, identity)
    table = colour_table(identity, near, far)
    _, height, width = codes.shape
    pad = ((0, height % 2), (0, width % 2))
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:  # (faststart needs a file to rewrite)
        # bf=0: no reordering, so the first frame is presented at time 0 (pts i is time i / fps)
        stream: Any = container.add_stream("libx264", rate=fps, options={
            "preset": PRESET, "crf": str(CRF), "g": str(GOP), "bf": "0"})
        stream.width, stream.height = width + width % 2, height + height % 2
        stream.pix_fmt = "yuv420p"
        for i, frame_codes in enumerate(codes):
            frame = av.VideoFrame.from_ndarray(table[np.pad(frame_codes, pad, mode="edge")], format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return DepthPreview(out.getvalue(), len(codes), near, far)
