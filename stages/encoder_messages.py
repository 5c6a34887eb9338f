"""The messages between a worker and its encoder process (stages/encoder_process.py, stages/encoder_child.py).

Frozen dataclasses, pickled over the two processes' socket pair (never stored) and dispatched on their type. To
the child: :class:`Setup` once, then :class:`EncodeFrame` (the frame's images wait in a slot of the shared
memory), :class:`EndAttempt`, :class:`Hurry` (the worker waits for a result) and :class:`Quit`. Back, one per
frame or end in order: :class:`Done`, or :class:`Failed` once (the lane's own error, so a full disk stays a
``StorageWriteError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from demoforge.stages.records import AttemptKey, CameraTail
from demoforge.stages.settings import VideoSettings
from demoforge.storage.schema import CameraSpec

Result = dict[str, bytes | CameraTail | None]
"""One job's result per camera: a frame's encoded bytes, or an attempt's tail (None: its video was dropped)."""


@dataclass(frozen=True)
class Setup:
    """The lanes to run: the job's cameras and encoding, where frame statistics spill, the ring's slots and
    whether the encoders run at idle priority."""

    cameras: tuple[CameraSpec, ...]
    fps: int
    settings: VideoSettings
    stats_dir: Path | None
    slots: int
    idle: bool


@dataclass(frozen=True)
class EncodeFrame:
    """Encode the frame of attempt ``key`` that waits in shared-memory slot ``slot``."""

    key: AttemptKey
    slot: int


@dataclass(frozen=True)
class EndAttempt:
    """Attempt ``key`` ended: finish its videos (``keep``) or abort them."""

    key: AttemptKey
    keep: bool


@dataclass(frozen=True)
class Hurry:
    """The worker waits for a result: raise the encoders to normal priority until every job has its result."""


@dataclass(frozen=True)
class Quit:
    """Stop: the lanes abort the encoders they hold."""


ToChild = Setup | EncodeFrame | EndAttempt | Hurry | Quit


@dataclass(frozen=True)
class Done:
    """The next job's result, and each camera's encoding seconds so far."""

    result: Result
    busy: dict[str, float]


@dataclass(frozen=True)
class Failed:
    """An encoder failed; the worker raises ``error`` at this result."""

    error: BaseException


FromChild = Done | Failed
