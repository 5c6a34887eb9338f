"""Frozen records that cross stage boundaries: what the executor emits and every later stage consumes, and
the types that feed it work (the plan stage's assignments; the resume state they are planned from is the
catalog's, storage/catalog.py).

Frames of several attempts interleave (vector rows, several workers), so every record carries the
:class:`AttemptKey` it belongs to and stages key their state by it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

import numpy as np

from demoforge.stages.contract import Annotations, EpisodeResult


# ---------------------------------------------------------------------------- work for the executor
@dataclass(frozen=True)
class EpisodeLayout:
    """How a job's episode indices divide among its tasks. A job of one task numbers its episodes 0, 1, 2, ...;
    a suite of ``groups`` tasks gives member ``g`` the indices ``g * STRIDE + k``, so an index names its member
    in every process (workers, replay) and an abandoned episode is replaced by another of the same member."""

    groups: int = 1

    STRIDE: ClassVar[int] = 1_000_000  # the most episodes one member of a suite can be asked for

    def group(self, index: int) -> int:
        return index // self.STRIDE if self.groups > 1 else 0

    def index(self, group: int, k: int) -> int:
        """The ``k``-th episode index of member ``group``."""
        return group * self.STRIDE + k if self.groups > 1 else k


@dataclass(frozen=True)
class EpisodeAssignment:
    """An episode index to produce, starting at ``first_attempt`` (attempts already spent in earlier runs)."""

    episode_index: int
    first_attempt: int = 0


class Pending(enum.Enum):
    """The type of :data:`PENDING` (an enum member, so type checkers narrow ``is PENDING`` tests)."""

    PENDING = "PENDING"

    def __repr__(self) -> str:
        return "PENDING"


#: Returned by a work source asked not to wait when no episode is available yet (but more may come).
PENDING: Literal[Pending.PENDING] = Pending.PENDING


class WorkSource(Protocol):
    """Where an executor takes its episodes from (the plan stream in a job, a range in tests)."""

    def next_episode(self, wait: bool = True) -> EpisodeAssignment | None | Pending:
        """The next episode to run; None when there will be no more work for this executor.

        With ``wait=False`` it returns :data:`PENDING` instead of blocking: the executor never blocks one
        vector row's refill while another row still has an episode to finish.
        """
        ...


# ------------------------------------------------------------------------------ from the executor
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
    """The attempt is over; ``result.keeps_data`` says whether the commit stage keeps its frames."""

    key: AttemptKey
    result: EpisodeResult
    frames: int


@dataclass(frozen=True)
class EpisodeAbandoned:
    """Every allowed attempt at this episode index failed; the job moves on to another index."""

    episode_index: int
    attempts: int
    last_reason: str


#: What the step stage (or any executor) sends the encode stage.
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


@dataclass(frozen=True, eq=False)
class CameraTail:
    """What one camera's encoder hands over when its attempt ends: the bytes it flushed and LeRobot's
    statistics of the attempt's frames (``storage/lerobot_stats.py``: per channel min, max, mean, std, count,
    quantiles; numpy arrays by name)."""

    data: bytes
    stats: Mapping[str, np.ndarray]


@dataclass(frozen=True, eq=False)
class VideoTail:
    """The bytes each camera's encoder flushed when its attempt ended, and each camera's frame statistics
    (attempts whose data is kept only)."""

    key: AttemptKey
    video: Mapping[str, bytes]
    stats: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)


# ----------------------------------------------------------------------------- after the write stage
@dataclass(frozen=True)
class StagedAttempt:
    """An ended attempt whose data (if kept) is fully written, awaiting commit or discard."""

    ended: AttemptEnded
    video_bytes: Mapping[str, int]
    content_hash: str | None


#: What the encode stage (or a remote worker's pieces) sends the write stage.
EncodedRecord = AttemptStarted | EncodedFrame | VideoTail | AttemptEnded | EpisodeAbandoned
#: What the write stage sends the commit stage.
StagedRecord = StagedAttempt | EpisodeAbandoned
