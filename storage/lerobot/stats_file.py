"""A dataset's ``meta/stats.json``: LeRobot's aggregation of its episodes' statistics, read and written as
LeRobot does.

The arithmetic is LeRobot 0.6.1's ``aggregate_stats`` operation for operation (count-weighted means and
quantiles, the parallel variance formula, element-wise min and max), and the file is what its ``write_stats``
writes (nested JSON, indented by 4), because importing ``lerobot.datasets`` costs about 8 CPU-s of torch and
``datasets`` in every export and edit process. Tests compare the numbers and the file's bytes with LeRobot's own
functions on the same input, so a LeRobot release that changes them fails there first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DatasetStats = dict[str, dict[str, np.ndarray]]


class StatsShapeError(ValueError):
    """Statistics that LeRobot's aggregation would refuse: not arrays, a scalar, or a bad ``count`` shape."""


def _check(stats: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    for feature, per in stats.items():
        for name, value in per.items():
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise StatsShapeError(f"statistic {name!r} of {feature!r} is not an array of at least one dimension")
            if name == "count" and value.shape != (1,):
                raise StatsShapeError(f"'count' of {feature!r} has shape {value.shape}, not (1,)")


def _aggregate_feature(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    means = np.stack([p["mean"] for p in parts])
    variances = np.stack([p["std"] ** 2 for p in parts])
    counts = np.stack([p["count"] for p in parts])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    out = {"min": np.min(np.stack([p["min"] for p in parts]), axis=0),
           "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
           "mean": mean, "std": np.sqrt(variance), "count": total}
    for key in (k for k in parts[0] if k.startswith("q") and k[1:].isdigit()):
        if all(key in p for p in parts):
            out[key] = (np.stack([p[key] for p in parts]) * counts).sum(axis=0) / total
    return out


def aggregate_stats(parts: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> DatasetStats:
    """The statistics of the union of ``parts`` (episodes' or datasets'), every feature any part has."""
    for part in parts:
        _check(part)
    # LeRobot gathers the keys in a set, so its stats.json lists features in a different order in each process;
    # first appearance keeps the same values in one order, and the same export gives the same bytes.
    features = dict.fromkeys(key for part in parts for key in part)
    return {key: _aggregate_feature([part[key] for part in parts if key in part]) for key in features}


def stats_json_text(stats: Mapping[str, Mapping[str, Any]]) -> str:
    """``meta/stats.json``'s text, as LeRobot's ``write_stats`` writes it."""
    def plain(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, (int, float, list)):
            return value
        raise TypeError(f"a statistic of type {type(value).__name__} cannot be written")

    return json.dumps({feature: {name: plain(v) for name, v in per.items()} for feature, per in stats.items()},
                      indent=4, ensure_ascii=False)


def read_stats(path: Path) -> DatasetStats | None:
    """A ``stats.json`` as arrays (LeRobot's ``load_stats``); None when the file does not exist."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return {feature: {name: np.atleast_1d(np.array(value)) for name, value in per.items()}
            for feature, per in raw.items()}
