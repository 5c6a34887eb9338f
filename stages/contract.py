"""The segment-aware demonstration contract: what a task gives the executor and what the executor reports.

A *task* is a gymnasium env (or any wrapper around one) that can plan demonstrations. It implements
``create_demo_segments()``, returning one :class:`Segment`, an iterable of them, or a generator that plans
each segment only when the executor asks for it (after the previous one ran and validated), so it can read
the state that segment left. A task that only has ``create_demo_action_list()`` is one segment named
``"legacy"``. Methods are looked up through the gymnasium wrapper chain, outermost first; each is a
protocol of stages/task_protocol.py, which a plugin author can type-check a task against.

Optional task methods (all looked up the same way):

- ``demo_hold_action() -> action``: what a finished vector row is stepped with while other rows continue.
  Without it the row is stepped with ``stages/actions.py: default_hold_action`` (zeros: "no motion" for delta
  control).
- ``demo_success(observation, info) -> bool``: the episode's success check. Without it
  ``info["success"]`` or ``info["is_success"]`` decides, and a plan that ran to its end counts as successful
  when neither key exists.
- ``demo_record(observation) -> RecordedObservation``: which state vectors and camera images a frame
  records. Without it an array observation is recorded as ``observation.state`` and no camera.
- ``demo_instruction() -> str``: the episode's language instruction (LeRobot's "task").
- ``demo_select_episode(episode_index) -> str | None``: called before each attempt's reset with the job's
  episode index. A suite (several tasks in one job, ``pipeline/tasks/suite.py``) becomes the member task that
  owns the index and returns its name, which the episode records as its task.
- ``demo_attempt_seed(episode_index) -> int``: the seed of the attempt (after ``demo_select_episode``), instead
  of the one derived from the job seed; a task that plays recorded episodes back (rerender) keeps theirs.
- ``demo_randomize(seed) -> Mapping | None``: called before each attempt's reset (after
  ``demo_select_episode``) with the attempt's seed; redraws the scene (``pipeline/tasks/randomization.py``)
  and returns the drawn values, which the episode records (JSON-safe). A task that also draws appearance
  variants of a seed's scene takes ``demo_randomize(seed, variant)`` (variant 0: the seed's own scene), which a
  rerender with several variants and replay of its episodes call.
- ``demo_poses() -> TaskPoses | None``: the robot's and the objects' poses, and target poses as actions, which
  ``demoforge multiply`` reads and commands (None: not for this configuration of the task).

A reactive expert (observation -> action) becomes segments through ``pipeline/reactive.py``.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from demoforge.storage.schema import SCHEMA_VERSION

LEGACY_SEGMENT_NAME = "legacy"


class TerminalReason(enum.StrEnum):
    """Why an attempt ended. Only ``SUCCESS`` attempts are committed, except that a policy-driven attempt's
    failure by the env (``FAILURE``, ``TRUNCATED``) is kept too (:data:`KEPT_POLICY_FAILURES`)."""

    SUCCESS = "success"
    FAILURE = "failure"  # the env terminated and the success check said no
    TRUNCATED = "truncated"  # the env truncated, even on the plan's last action
    SEGMENT_VALIDATION_FAILED = "segment_validation_failed"
    EMPTY_SEGMENT = "empty_segment"
    EMPTY_PLAN = "empty_plan"
    INTERRUPTED = "interrupted"
    TASK_INCOMPLETE = "task_incomplete"  # the plan ran out and the success check said no
    ERROR = "error"  # the task, the env or the data raised; see the attempt's error


#: Reasons that do not count against an episode's attempts (the attempt was stopped from outside).
NOT_COUNTED = frozenset({TerminalReason.INTERRUPTED})
# A policy's rollout that the env ended without success is data too: its states are where the policy goes
# wrong, and every label is still the expert's (stages/control.py). Its last frame carries the flag that ended it.
KEPT_POLICY_FAILURES = frozenset({TerminalReason.FAILURE, TerminalReason.TRUNCATED})
#: Failed attempts that `generate --keep-failures` keeps as episodes of their own (besides the successes):
#: the env said no, the env truncated, a segment's validator said no, or the plan ran out without success.
#: Errors (a raising task, env or policy), interruptions and empty plans are not data.
KEEPABLE_FAILURES = frozenset({TerminalReason.FAILURE, TerminalReason.TRUNCATED,
                               TerminalReason.SEGMENT_VALIDATION_FAILED, TerminalReason.TASK_INCOMPLETE})
POLICY_DRIVER = "policy"


# --------------------------------------------------------------------------------------------- errors
class DemoError(Exception):
    """An attempt failed because of the task, the env or the data; the attempt is discarded.

    Carries where it happened so the message names the task, segment and step.
    """

    def __init__(self, message: str, *, task: str = "?", segment: str | None = None,
                 segment_id: int | None = None, step: int | None = None) -> None:
        self.detail = message
        self.task = task
        self.segment = segment
        self.segment_id = segment_id
        self.step = step
        super().__init__(self._render())

    def _render(self) -> str:
        return f"{self.where()}: {self.detail}"

    def where(self) -> str:
        """The task, and the segment and step where known: "task 'fetch', segment 2:'lift', step 14"."""
        where = [f"task {self.task!r}"]
        if self.segment is not None:
            where.append(f"segment {self.segment_id}:{self.segment!r}")
        if self.step is not None:
            where.append(f"step {self.step}")
        return ", ".join(where)

    def locate(self, *, task: str, segment: str | None, segment_id: int | None, step: int | None) -> DemoError:
        """Fill in the location where it was not known when raised."""
        self.task = task if self.task == "?" else self.task
        if self.segment is None:
            self.segment, self.segment_id = segment, segment_id
        if self.step is None:
            self.step = step
        self.args = (self._render(),)
        return self


class TaskProtocolError(DemoError, TypeError):
    """The task broke the contract: yielded a non-Segment, has no planning method, bad metadata."""


class ActionError(DemoError, ValueError):
    """An action had the wrong shape, a non-numeric dtype, or NaN/inf values."""


class ObservationError(DemoError, ValueError):
    """An observation or camera image was non-finite or changed shape."""


class EnvError(DemoError, RuntimeError):
    """The env raised in reset or step."""


class TaskError(DemoError, RuntimeError):
    """The task's own code (planner, action generator, validator, success check) raised."""


# ------------------------------------------------------------------------------------------ segments
Validator = Callable[["StepView"], "bool | np.bool_ | np.ndarray"]


@dataclass(frozen=True, eq=False)
class Segment:
    """One semantic sub-trajectory: the actions to run and how to judge them.

    ``actions`` may be a lazy iterator; it is consumed one action at a time, each computed after the
    previous one was stepped, so closed-loop controllers can read the env's current state.
    ``validator`` runs after the actions run out with the last transition and returns a bool (or a
    one-element array).
    """

    actions: Iterable[Any]
    name: str
    target: str | None = None
    instruction: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    validator: Validator | None = None


@dataclass(frozen=True)
class StepView:
    """The last transition of a segment, handed to its validator."""

    observation: Any
    reward: float
    terminated: bool
    truncated: bool
    info: Mapping[str, Any]


@dataclass(frozen=True)
class RecordedObservation:
    """What one frame records of an observation: named state vectors and camera images (H, W, 3) uint8."""

    state: Mapping[str, np.ndarray]
    images: Mapping[str, np.ndarray] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- annotations


@dataclass(frozen=True, slots=True)
class Annotations:
    """Per-frame labels; exported as int64 ``annotation.<key>`` features (flags are 0/1)."""

    episode_step: int
    segment_id: int
    segment_step: int
    segment_start: bool
    segment_end: bool
    terminated: bool
    truncated: bool
    valid: bool = True

    def as_tuple(self) -> tuple[int, ...]:
        """Values in ``storage/schema.py`` ``ANNOTATION_KEYS`` order (the keys' one home)."""
        return (int(self.valid), self.episode_step, self.segment_id, self.segment_step,
                int(self.segment_start), int(self.segment_end), int(self.terminated), int(self.truncated))


# -------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class SegmentResult:
    """One segment as it ran: its span ``[start_step, end_step)`` in episode steps and its verdict."""

    segment_id: int
    name: str
    start_step: int
    end_step: int
    success: bool
    failure_reason: str | None = None
    target: str | None = None
    instruction: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.end_step - self.start_step

    def to_record(self) -> dict[str, Any]:
        return {"segment_id": self.segment_id, "name": self.name, "target": self.target,
                "instruction": self.instruction, "metadata": dict(self.metadata),
                "start_step": self.start_step, "end_step": self.end_step, "success": self.success,
                "failure_reason": self.failure_reason}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SegmentResult:
        return cls(segment_id=int(record["segment_id"]), name=str(record["name"]),
                   start_step=int(record["start_step"]), end_step=int(record["end_step"]),
                   success=bool(record["success"]), failure_reason=record.get("failure_reason"),
                   target=record.get("target"), instruction=record.get("instruction"),
                   metadata=dict(record.get("metadata") or {}))


@dataclass(frozen=True)
class EpisodeResult:
    """The outcome of one attempt at one episode. ``committable`` decides whether it may become data."""

    task: str
    episode_index: int
    attempt: int
    seed: int
    row: int
    length: int
    completed: bool
    success: bool
    terminated: bool
    truncated: bool
    terminal_reason: TerminalReason
    segments: tuple[SegmentResult, ...]
    instruction: str | None = None
    error: str | None = None
    error_type: str | None = None
    duration_s: float = 0.0
    driver: str | None = None  # who drove (stages/control.py), None: the expert, with nothing else recorded
    interventions: int = 0  # the expert's takeovers of a policy
    randomization: Mapping[str, Any] | None = None  # what demo_randomize drew for this attempt
    kept: bool = False  # a failed attempt kept as an episode of its own (generate --keep-failures)

    @property
    def succeeded(self) -> bool:
        return self.completed and self.success and self.terminal_reason is TerminalReason.SUCCESS

    @property
    def committable(self) -> bool:
        return self.succeeded or (self.driver == POLICY_DRIVER and self.terminal_reason in KEPT_POLICY_FAILURES)

    @property
    def keeps_data(self) -> bool:
        """The attempt's frames become data: a committable attempt, or a failure kept (not filling its slot)."""
        return self.committable or self.kept

    @property
    def counts_as_attempt(self) -> bool:
        return self.terminal_reason not in NOT_COUNTED

    @property
    def failure_reason(self) -> str | None:
        """A short human reason: the error, a failed segment's reason, or the terminal reason."""
        if self.succeeded:
            return None
        if self.error:
            return self.error
        for seg in self.segments:
            if not seg.success and seg.failure_reason:
                return f"{seg.name}: {seg.failure_reason}"
        return self.terminal_reason.value

    @property
    def failed_segment(self) -> SegmentResult | None:
        """The segment the attempt failed in: the first whose check failed, else the last one it entered."""
        if self.succeeded or not self.segments:
            return None
        return next((s for s in self.segments if not s.success), self.segments[-1])

    def to_record(self) -> dict[str, Any]:
        """A JSON-safe dict with the schema version; :meth:`from_record` reads it back."""
        return {"schema_version": SCHEMA_VERSION, "task": self.task, "episode_index": self.episode_index,
                "attempt": self.attempt, "seed": self.seed, "row": self.row, "length": self.length,
                "completed": self.completed, "success": self.success, "terminated": self.terminated,
                "truncated": self.truncated, "terminal_reason": self.terminal_reason.value,
                "failure_reason": self.failure_reason, "instruction": self.instruction,
                "error": self.error, "error_type": self.error_type,
                "timings": {"duration_s": self.duration_s},
                "segments": [s.to_record() for s in self.segments],
                # Only for controlled jobs: an expert-only record is unchanged.
                **({"driver": self.driver, "interventions": self.interventions} if self.driver else {}),
                **({"randomization": dict(self.randomization)} if self.randomization is not None else {}),
                # Only for failures kept as data: which segment failed (its id and name) and that it was kept.
                **({"kept_failure": True, "failed_segment": self._failed_segment_record()} if self.kept else {})}

    def _failed_segment_record(self) -> dict[str, Any] | None:
        seg = self.failed_segment
        return None if seg is None else {"segment_id": seg.segment_id, "name": seg.name}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EpisodeResult:
        version = record.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"episode record has schema_version {version!r}; this demoforge reads "
                             f"{SCHEMA_VERSION}")
        return cls(task=str(record["task"]), episode_index=int(record["episode_index"]),
                   attempt=int(record["attempt"]), seed=int(record["seed"]), row=int(record["row"]),
                   length=int(record["length"]), completed=bool(record["completed"]),
                   success=bool(record["success"]), terminated=bool(record["terminated"]),
                   truncated=bool(record["truncated"]),
                   terminal_reason=TerminalReason(record["terminal_reason"]),
                   segments=tuple(SegmentResult.from_record(s) for s in record["segments"]),
                   instruction=record.get("instruction"), error=record.get("error"),
                   error_type=record.get("error_type"),
                   duration_s=float((record.get("timings") or {}).get("duration_s", 0.0)),
                   driver=record.get("driver"), interventions=int(record.get("interventions") or 0),
                   randomization=record.get("randomization"), kept=bool(record.get("kept_failure", False)))


# ----------------------------------------------------------------------------------- checks
def check_json_safe(value: Any, what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TaskProtocolError(f"{what} is not JSON-compatible: {exc}") from None


def as_bool_verdict(value: Any, what: str) -> bool:
    """A validator's or success check's answer as one bool (scalars or one-element arrays)."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise TaskProtocolError(f"{what} returned {value!r:.80}; expected one bool")
    scalar = array.reshape(()).item()
    if isinstance(scalar, float) and math.isnan(scalar):
        raise TaskProtocolError(f"{what} returned NaN; expected one bool")
    return bool(scalar)
