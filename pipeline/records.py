"""Frozen records that cross stage boundaries: what the executor emits and every later stage consumes.

Frames of several attempts interleave (vector rows, several workers), so every record carries the
:class:`AttemptKey` it belongs to and stages key their state by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from demoforge.pipeline.contract import Annotations, EpisodeResult


@dataclass(frozen=True, order=True)
class AttemptKey:
    """Identity of one attempt: the job's episode index and the attempt number (0-based)."""

    episode_index: int
    attempt: int

    @property
    def episode_id(self) -> str:
        """A stable, filesystem-safe name for the attempt's staged data."""
        return f"ep{self.episode_index:08d}-a{self.attempt:02d}"


@dataclass(frozen=True)
class AttemptStarted:
    key: AttemptKey
    seed: int
    row: int
    worker: int = 0


@dataclass(frozen=True, eq=False)
class Frame:
    """One recorded step: the observation seen *before* the action, the action, the reward it earned."""

    key: AttemptKey
    step: int
    state: Mapping[str, np.ndarray]
    action: np.ndarray
    reward: float
    annotations: Annotations
    images: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptEnded:
    """The attempt is over; ``result.committable`` says whether the commit stage may keep it."""

    key: AttemptKey
    result: EpisodeResult
    frames: int


@dataclass(frozen=True)
class EpisodeAbandoned:
    """Every allowed attempt at this episode index failed; the job moves on to another index."""

    episode_index: int
    attempts: int
    last_reason: str


Record = AttemptStarted | Frame | AttemptEnded | EpisodeAbandoned


# ---------------------------------------------------------------------------- after the encode stage
@dataclass(frozen=True, eq=False)
class EncodedFrame:
    """A frame whose images became encoded bytes (possibly empty: encoders buffer a few frames)."""

    key: AttemptKey
    step: int
    state: Mapping[str, np.ndarray]
    action: np.ndarray
    reward: float
    annotations: Annotations
    video: Mapping[str, bytes]


@dataclass(frozen=True)
class VideoTail:
    """The bytes each camera's encoder flushed when its attempt ended (committable attempts only)."""

    key: AttemptKey
    video: Mapping[str, bytes]


# ----------------------------------------------------------------------------- after the write stage
@dataclass(frozen=True)
class StagedAttempt:
    """An ended attempt whose data (if committable) is fully written, awaiting commit or discard."""

    ended: AttemptEnded
    video_bytes: Mapping[str, int]
    content_hash: str | None
