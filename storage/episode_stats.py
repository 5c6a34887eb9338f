"""An episode's feature statistics as staging stores them: computed once at commit, exported as they are.

The record (a JSON object, the ``demoforge_stats`` attribute of a staged episode, covered by its content hash)
holds LeRobot's statistics (``storage/lerobot_stats.py``) of every staged array, as the export converts it
into a feature: each state vector and the action as float32 (a one-element vector as a scalar column), the
reward as float32, each annotation column as int64, and each camera over LeRobot's frame sample. Keys are
staging names (state features, ``action``, ``reward``, annotation names, camera names); the exporter maps them
to dataset feature keys. The automatic columns (``index``, ``episode_index``, ...) depend on where an episode
lands in a dataset and are computed at export.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from demoforge.storage.lerobot_stats import STATS_METHOD, FeatureStats, stats_from_json, stats_to_json, vector_stats
from demoforge.storage.schema import ANNOTATION_KEYS


def as_feature(values: np.ndarray, dtype: type) -> np.ndarray:
    """A staged array as the exporter writes its feature column: ``dtype``, one-element rows as scalars."""
    values = np.asarray(values).astype(dtype)
    return values.reshape(len(values)) if values.shape[1:] == (1,) else values


@dataclass(frozen=True)
class EpisodeStats:
    """LeRobot's statistics of one staged episode's features, by staging name."""

    state: Mapping[str, FeatureStats]
    action: FeatureStats
    reward: FeatureStats
    annotations: Mapping[str, FeatureStats]
    cameras: Mapping[str, FeatureStats]

    @classmethod
    def compute(cls, state: Mapping[str, np.ndarray], action: np.ndarray, reward: np.ndarray,
                annotations: np.ndarray, cameras: Mapping[str, FeatureStats]) -> EpisodeStats:
        """From the staged arrays (``annotations``: (N, len(ANNOTATION_KEYS)) int32) and each camera's
        statistics (computed by its encoder from the frames it saw)."""
        return cls(state={name: vector_stats(as_feature(values, np.float32)) for name, values in state.items()},
                   action=vector_stats(as_feature(action, np.float32)),
                   reward=vector_stats(as_feature(reward, np.float32)),
                   annotations={key: vector_stats(np.asarray(annotations[:, i]).astype(np.int64))
                                for i, key in enumerate(ANNOTATION_KEYS)},
                   cameras=dict(cameras))

    def to_json(self) -> dict[str, Any]:
        return {"method": STATS_METHOD,
                "state": {k: stats_to_json(v) for k, v in self.state.items()},
                "action": stats_to_json(self.action), "reward": stats_to_json(self.reward),
                "annotations": {k: stats_to_json(v) for k, v in self.annotations.items()},
                "cameras": {k: stats_to_json(v) for k, v in self.cameras.items()}}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EpisodeStats:
        """Raises ValueError (naming what is wrong) for a record this code cannot read."""
        if not isinstance(obj, Mapping) or obj.get("method") != STATS_METHOD:
            method = obj.get("method") if isinstance(obj, Mapping) else None
            raise ValueError(f"statistics computed by {method!r}; this demoforge reads {STATS_METHOD!r}")
        try:
            return cls(state={k: stats_from_json(v) for k, v in obj["state"].items()},
                       action=stats_from_json(obj["action"]), reward=stats_from_json(obj["reward"]),
                       annotations={k: stats_from_json(v) for k, v in obj["annotations"].items()},
                       cameras={k: stats_from_json(v) for k, v in obj["cameras"].items()})
        except (KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"statistics record lacks {exc}") from None

    def numeric_differences(self, other: EpisodeStats) -> list[str]:
        """The staged arrays whose statistics differ between two records (cameras are not compared)."""
        pairs = [(f"state/{k}", v, other.state.get(k)) for k, v in self.state.items()]
        pairs += [("action", self.action, other.action), ("reward", self.reward, other.reward)]
        pairs += [(f"annotations/{k}", v, other.annotations.get(k)) for k, v in self.annotations.items()]
        return [name for name, a, b in pairs if b is None or not _same(a, b)]


def _same(a: FeatureStats, b: FeatureStats) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True)
                                        for k in a)
