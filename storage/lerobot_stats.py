"""LeRobot 0.6.1's per-episode feature statistics, computed exactly as its writer computes them.

LeRobot's writer (``compute_episode_stats``) records, per feature, ``min``, ``max``, ``mean``, ``std``, ``count`` and
the quantiles ``q01 q10 q50 q90 q99``: one ``RunningQuantileStats.update`` over the episode's values (float32
sums, quantiles read off a 5000-bin histogram between min and max). A camera's statistics are per channel
over the frames ``sample_indices(N)`` picks, strided by ``auto_downsample_height_width``, RGB divided by 255,
depth maps kept in their unit. This module does the same arithmetic, operation for operation: the same float32
sums in the same order (LeRobot's sums are sequential over the pixels, which rounds: its mean differs from the
true mean by about 1e-5 and its std by up to ~1% at 224x224, so only the same operations give its numbers), the
same bin edges and interpolation. Tests compare every value with LeRobot's own functions.

Two things are done differently without changing any result: a histogram is counted (per-channel counts of
the uint8 values, or ``searchsorted`` into the edges) instead of ``np.histogram``'s sort, and an RGB camera's
frames are summed one at a time in one compiled pass each (``storage/rgb_sums.py``: the running sum carried
into the next frame's, so the operations are those of one long sum), which keeps memory at one frame. A
100-frame 224x224 camera costs about 10 ms instead of LeRobot's 4 s.

Importing this module does not import lerobot or torch (the recorder uses it; importing lerobot costs
hundreds of MB and seconds), nor anything of demoforge but its compiled sums: it is a leaf of the ground
floor, which staging and store verification (below storage/lerobot/) and the export (in it) share.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from demoforge.storage.rgb_sums import add_pixels

#: What LeRobot 0.6.1 records (``compute_stats.DEFAULT_QUANTILES``, ``RunningQuantileStats``).
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
QUANTILE_BINS = 5000
#: ``auto_downsample_height_width``'s defaults: frames of 300 px or more are strided to about 150 px.
STATS_TARGET_PX = 150
STATS_MAX_PX = 300
#: How stored statistics were computed (recorded with them, so a later change of method is visible).
STATS_METHOD = "lerobot-0.6.1"

FeatureStats = dict[str, np.ndarray]


# ----------------------------------------------------------------------------- LeRobot's frame sample
def estimate_num_samples(length: int, min_num_samples: int = 100, max_num_samples: int = 10_000,
                         power: float = 0.75) -> int:
    """``compute_stats.estimate_num_samples``: every frame up to 100, then ``length ** 0.75``."""
    if length < min_num_samples:
        min_num_samples = length
    return max(min_num_samples, min(int(length**power), max_num_samples))


def sample_indices(length: int) -> list[int]:
    """``compute_stats.sample_indices``: the frames of an episode of ``length`` whose pixels enter its stats."""
    return np.round(np.linspace(0, length - 1, estimate_num_samples(length))).astype(int).tolist()


def stats_stride(height: int, width: int) -> int:
    """The stride ``auto_downsample_height_width`` takes rows and columns with (1: the frame as it is)."""
    if max(width, height) < STATS_MAX_PX:
        return 1
    return int(width / STATS_TARGET_PX) if width > height else int(height / STATS_TARGET_PX)


# ------------------------------------------------------------------------ RunningQuantileStats, once
def _edges(low: np.ndarray, high: np.ndarray) -> list[np.ndarray]:
    return [np.linspace(low[i] - 1e-10, high[i] + 1e-10, QUANTILE_BINS + 1) for i in range(len(low))]


def _quantile(cumsum: np.ndarray, edges: np.ndarray, target: float) -> Any:
    """``RunningQuantileStats._compute_single_quantile`` on a histogram's cumulative counts."""
    idx = np.searchsorted(cumsum, target)
    if idx == 0:
        return edges[0]
    if idx >= len(cumsum):
        return edges[-1]
    before = cumsum[idx - 1]
    in_bin = cumsum[idx] - before
    if in_bin == 0:
        return edges[idx]
    fraction = (target - before) / in_bin
    return edges[idx] + fraction * (edges[idx + 1] - edges[idx])


def _statistics(count: int, total: np.ndarray, total_sq: np.ndarray, low: np.ndarray, high: np.ndarray,
                histograms: list[np.ndarray], edges: list[np.ndarray]) -> FeatureStats:
    """What ``RunningQuantileStats`` returns after one ``update`` of ``count`` vectors: ``total`` and
    ``total_sq`` are the per-column float sums ``np.mean`` divides (the same ufunc calls as ``np.mean``)."""
    mean = np.true_divide(total, np.intp(count), out=np.empty_like(total), casting="unsafe")
    mean_sq = np.true_divide(total_sq, np.intp(count), out=np.empty_like(total_sq), casting="unsafe")
    # update(): the running mean starts at the batch mean and takes one step towards the (same) batch mean.
    batch_mean, batch_mean_sq = mean.copy(), mean_sq.copy()
    mean += (batch_mean - mean) * (count / count)
    mean_sq += (batch_mean_sq - mean_sq) * (count / count)
    stats: FeatureStats = {"min": low.copy(), "max": high.copy(), "mean": mean.copy(),
                           "std": np.sqrt(np.maximum(0, mean_sq - mean**2)), "count": np.array([count])}
    sums = [np.cumsum(h) for h in histograms]
    for q, key in zip(QUANTILES, QUANTILE_KEYS):
        stats[key] = np.array([_quantile(c, e, q * count) for c, e in zip(sums, edges)])
    return stats


def _histograms_of_values(batch: np.ndarray, edges: list[np.ndarray]) -> list[np.ndarray]:
    """``np.histogram(batch[:, i], bins=edges[i])`` per column, as LeRobot accumulates them (float64), counted
    by ``searchsorted`` into the edges instead of sorting the values (the same bin for every value)."""
    out = []
    for i, e in enumerate(edges):
        column = batch[:, i]
        idx = np.searchsorted(e, column, side="right") - 1
        idx[(column == e[-1])] = len(e) - 2  # the last bin includes its right edge
        inside = (idx >= 0) & (idx < len(e) - 1)
        out.append(np.zeros(QUANTILE_BINS) + np.bincount(idx[inside], minlength=QUANTILE_BINS))
    return out


def _basic(array: np.ndarray, count: int) -> FeatureStats:
    """``_compute_basic_stats``: fewer than two vectors; the quantiles are the mean."""
    stats: FeatureStats = {"min": np.min(array, axis=0), "max": np.max(array, axis=0),
                           "mean": np.mean(array, axis=0), "std": np.std(array, axis=0), "count": np.array([count])}
    for key in QUANTILE_KEYS:
        stats[key] = stats["mean"].copy()
    return stats


def _running(batch: np.ndarray, count: int) -> FeatureStats:
    """``get_feature_stats`` for a (vectors, columns) batch: ``RunningQuantileStats().update(batch)``."""
    if batch.shape[0] < 2:
        return _basic(batch, count)
    batch = batch.astype(np.result_type(batch.dtype, np.float32), copy=False)
    low, high = np.min(batch, axis=0), np.max(batch, axis=0)
    edges = _edges(low, high)
    stats = _statistics(batch.shape[0], np.add.reduce(batch, axis=0), np.add.reduce(batch**2, axis=0), low, high,
                        _histograms_of_values(batch, edges), edges)
    stats["count"] = np.array([count])
    return stats


def vector_stats(values: np.ndarray) -> FeatureStats:
    """A numeric feature of one episode, (N,) or (N, d): ``get_feature_stats(values, axis=0,
    keepdims=values.ndim == 1)``, as ``compute_episode_stats`` calls it."""
    values = np.asarray(values)
    stats = _running(values.reshape(-1, 1) if values.ndim == 1 else values, values.shape[0])
    if values.ndim == 1:
        return {k: v if k == "count" or v.ndim == 0 else v.reshape(1) for k, v in stats.items()}
    return stats


def _image_result(stats: FeatureStats, scale: float) -> FeatureStats:
    """``get_feature_stats(axis=(0, 2, 3), keepdims=True)``'s shapes, then ``compute_episode_stats``'s
    normalisation: (C, 1, 1) per statistic, divided by 255 for RGB."""
    out: FeatureStats = {}
    for key, value in stats.items():
        if key == "count":
            out[key] = value
        else:
            shaped = value.reshape(1, -1, 1, 1) if value.ndim == 1 else value
            out[key] = np.squeeze(shaped / scale, axis=0)
    return out


def depth_stats(frames: np.ndarray) -> FeatureStats:
    """A depth camera's statistics from its sampled, strided frames (S, h, w) in metres: LeRobot keeps the
    unit (no division). One channel: numpy sums a (pixels, 1) batch pairwise, so the whole batch is summed at
    once, exactly as LeRobot does."""
    frames = np.asarray(frames)
    return _image_result(_running(frames.reshape(-1, 1), frames.shape[0]), 1.0)


class RgbStats:
    """An RGB camera's statistics, fed its sampled, strided frames (h, w, 3) uint8 one at a time, in order.

    LeRobot sums the (pixels, 3) batch of all sampled frames with ``np.mean``: per channel, one sequential
    float32 sum. Each frame's pixels continue that same sum (``storage/rgb_sums.py``: the same float32
    additions in the same order, in one compiled pass), so the result equals the one long sum to the bit;
    min, max and the histograms come from per-channel counts of the 256 values."""

    def __init__(self) -> None:
        self.frames = 0
        self._pixels = 0
        self._total: np.ndarray = np.zeros(3, np.float32)
        self._total_sq: np.ndarray = np.zeros(3, np.float32)
        self._counts = np.zeros((3, 256), np.int64)

    def add(self, frame: np.ndarray) -> None:
        """One frame, (h, w, 3), any strides (a strided view is read where it lies, not copied)."""
        self._add(frame)

    def add_planar(self, channels: np.ndarray) -> None:
        """One frame as its three channels, (3, h, w) or (3, h * w): the same pixels in the same order as
        :meth:`add` (the form the recorder keeps its sampled frames in)."""
        self._add(channels.reshape(3, 1, -1).transpose(1, 2, 0))

    def _add(self, image: np.ndarray) -> None:
        add_pixels(image, self._total, self._total_sq, self._counts)
        self.frames += 1
        self._pixels += image.shape[0] * image.shape[1]

    def result(self) -> FeatureStats:
        if self._pixels < 2:
            raise ValueError("camera statistics need at least two pixels")
        present = [np.flatnonzero(c) for c in self._counts]
        low = np.array([p[0] for p in present], np.float32)
        high = np.array([p[-1] for p in present], np.float32)
        edges = _edges(low, high)
        levels = np.arange(256, dtype=np.float32)
        histograms = []
        for c, e in enumerate(edges):
            hist, _ = np.histogram(levels, bins=e, weights=self._counts[c])
            histograms.append(np.zeros(QUANTILE_BINS) + hist)
        stats = _statistics(self._pixels, self._total, self._total_sq, low, high, histograms, edges)
        stats["count"] = np.array([self.frames])
        return _image_result(stats, 255.0)


def rgb_stats(frames: Iterable[np.ndarray]) -> FeatureStats:
    """An RGB camera's statistics from its sampled, strided frames, (h, w, 3) uint8 each."""
    acc = RgbStats()
    for frame in frames:
        acc.add(frame)
    return acc.result()


def strided(image: np.ndarray) -> np.ndarray:
    """The pixels of a frame LeRobot's stats look at (``auto_downsample_height_width``), as a view."""
    step = stats_stride(image.shape[0], image.shape[1])
    return image if step == 1 else image[::step, ::step]


# ----------------------------------------------------------------------------------- stored form
def stats_to_json(stats: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """One feature's statistics as JSON, each with its dtype and shape, so reading gives the same arrays."""
    return {key: {"dtype": value.dtype.name, "shape": list(value.shape), "values": value.ravel().tolist()}
            for key, value in stats.items()}


def stats_from_json(obj: Mapping[str, Any]) -> FeatureStats:
    try:
        return {key: np.array(v["values"], dtype=np.dtype(v["dtype"])).reshape(v["shape"]) for key, v in obj.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed statistics: {exc}") from None


def json_digest(obj: Any) -> str:
    """A digest of a JSON value that does not depend on key order or spacing (what a content hash covers)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
