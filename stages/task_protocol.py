"""The task contract as types a plugin author can check a task against (``mypy``, ``pyright``).

A task is a gymnasium env (or a wrapper around one) that is a :class:`SegmentTask` or an
:class:`ActionListTask`; each optional capability is a protocol of one method. The executor finds a
capability as gymnasium's ``get_wrapper_attr`` finds an attribute: on the env or the first wrapper below it
(outermost first) whose class defines the method. What each method means: stages/contract.py.

    class PickPlace(gym.Env):            # satisfies SegmentTask and RecordsObservation
        def create_demo_segments(self) -> Iterator[Segment]: ...
        def demo_record(self, observation: Any) -> RecordedObservation: ...

    task: SegmentTask = PickPlace()      # the type checker says so, or names what is missing
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import gymnasium as gym
import numpy as np

from demoforge.stages.contract import (
    LEGACY_SEGMENT_NAME,
    RecordedObservation,
    Segment,
    TaskProtocolError,
    as_bool_verdict,
    check_json_safe,
)

__all__ = ["ActionListTask", "ChecksSuccess", "GivesInstruction", "HoldsAction", "Pose", "Randomizes",
           "RandomizesVariants", "RecordsObservation", "SeedsAttempt", "SegmentTask", "SelectsEpisode", "TaskPoses",
           "TracksPoses", "default_record", "default_success", "draw_randomization", "iter_segments", "recorder_of",
           "success_check", "task_capability"]

#: How deep a wrapper chain is searched (a loop of ``.env`` references must end).
MAX_WRAPPERS = 64


@runtime_checkable
class SegmentTask(Protocol):
    """Plans an episode as segments: one, an iterable of them, or a generator that plans each from the state
    the previous one left."""

    def create_demo_segments(self) -> Segment | Iterable[Segment]: ...


@runtime_checkable
class ActionListTask(Protocol):
    """Plans an episode as one flat list of actions (recorded as one ``"legacy"`` segment)."""

    def create_demo_action_list(self) -> Sequence[Any]: ...


@runtime_checkable
class HoldsAction(Protocol):
    """What a finished vector row is stepped with while other rows go on (default: zeros)."""

    def demo_hold_action(self) -> np.ndarray: ...


@runtime_checkable
class ChecksSuccess(Protocol):
    """The episode's success check (default: ``info["success"]`` / ``info["is_success"]``)."""

    def demo_success(self, observation: Any, info: Mapping[str, Any]) -> bool: ...


@runtime_checkable
class RecordsObservation(Protocol):
    """Which state vectors and camera images a frame records (default: an array observation as the state)."""

    def demo_record(self, observation: Any) -> RecordedObservation: ...


@runtime_checkable
class GivesInstruction(Protocol):
    """The episode's language instruction (LeRobot's ``task``)."""

    def demo_instruction(self) -> str: ...


@runtime_checkable
class SelectsEpisode(Protocol):
    """A suite: becomes the member task that owns the episode index and returns its name."""

    def demo_select_episode(self, episode_index: int) -> str | None: ...


@runtime_checkable
class SeedsAttempt(Protocol):
    """The attempt's seed instead of the one derived from the job seed (a task that plays episodes back)."""

    def demo_attempt_seed(self, episode_index: int) -> int: ...


@runtime_checkable
class Randomizes(Protocol):
    """Redraws the scene before each attempt's reset from its seed; returns the drawn values (JSON-safe)."""

    def demo_randomize(self, seed: int) -> Mapping[str, Any] | None: ...


@runtime_checkable
class RandomizesVariants(Protocol):
    """A :class:`Randomizes` task that also draws appearance variants of a seed's scene (what a rerender with
    several variants records): variant 0 is the scene the seed draws alone, a variant ``v > 0`` draws the
    appearance again from (seed, v) and leaves physics and the initial state as the seed drew them."""

    def demo_randomize(self, seed: int, variant: int = 0) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, eq=False)
class Pose:
    """A rigid pose in the world frame: ``position`` (3,) in metres and ``quaternion`` (4,) as (w, x, y, z),
    unit length. Both are float64 copies, so a pose never changes with the simulator's buffers."""

    position: np.ndarray
    quaternion: np.ndarray = field(default_factory=lambda: np.array([1.0, 0.0, 0.0, 0.0]))  # the identity

    def __post_init__(self) -> None:
        position = np.array(self.position, dtype=np.float64).reshape(-1)
        quaternion = np.array(self.quaternion, dtype=np.float64).reshape(-1)
        norm = float(np.linalg.norm(quaternion)) if quaternion.shape == (4,) else 0.0
        if position.shape != (3,) or not np.all(np.isfinite(position)) or not np.isfinite(norm) or norm < 1e-9:
            raise TaskProtocolError(f"a pose needs a finite position (3,) and a non-zero quaternion (4,), got "
                                    f"{self.position!r:.60} and {self.quaternion!r:.60}")
        object.__setattr__(self, "position", position)
        object.__setattr__(self, "quaternion", quaternion / norm)


@runtime_checkable
class TaskPoses(Protocol):
    """What ``demoforge multiply`` reads and commands of a task's robot and objects, in the world frame, at the
    env's current state (pipeline/multiply.py; docs/multiply.md).

    ``follows_plan``: the task's own planner may be asked for its segments one at a time without their actions
    being run (a planner, not a reactive expert): a multiplied episode then asks it for each segment as that
    segment starts, so the planner's side effects (fetch-pick-place draws each cycle's goal) and its validator
    apply to the generated segment."""

    follows_plan: bool

    def eef_pose(self) -> Pose:
        """The end effector's pose now."""
        ...

    def object_poses(self) -> Mapping[str, Pose]:
        """Every object a segment can be relative to, by the name segments use as ``target`` (and any other
        reference :meth:`reference` names, such as a goal)."""
        ...

    def reference(self, segment: str, target: str | None) -> str | None:
        """The object whose pose segment ``segment`` (its ``target`` as recorded) moves with: usually the target;
        a place or carry segment moves with where the object goes. None: relative to the previous segment's end."""
        ...

    def gripper(self, action: np.ndarray) -> float:
        """The gripper command inside ``action``."""
        ...

    def commanded_pose(self, action: np.ndarray) -> Pose:
        """The end-effector pose ``action`` asks for from the current state (what the controller is sent to)."""
        ...

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        """The action that sends the end effector toward ``pose`` from the current state (a Cartesian-delta arm:
        the delta, clipped to the action space; a joint arm: inverse kinematics), with ``gripper``."""
        ...


@runtime_checkable
class TracksPoses(Protocol):
    """The poses of the robot and the objects, and target poses as actions: what ``demoforge multiply`` needs
    to make new demonstrations from a few (None: not for this configuration of the task)."""

    def demo_poses(self) -> TaskPoses | None: ...


CapabilityT = TypeVar("CapabilityT")


def _method_of(capability: type) -> str:
    names = [n for n in vars(capability) if n.startswith(("demo_", "create_demo_"))]
    if len(names) != 1:
        raise TypeError(f"{capability.__name__} is not a task capability (one demo_* method)")
    return names[0]


def task_capability(env: object, capability: type[CapabilityT]) -> CapabilityT | None:
    """The env, or the first wrapper below it (outermost first), whose class defines ``capability``'s method;
    None when none does. (A wrapper's ``__getattr__`` forwarding is not followed: the class decides.)"""
    name = _method_of(capability)
    current: object = env
    for _ in range(MAX_WRAPPERS):
        if callable(getattr(type(current), name, None)):
            return cast(CapabilityT, current)
        if not isinstance(current, gym.Wrapper):
            return None
        current = current.env
    return None


def default_record(observation: Any) -> RecordedObservation:
    """What a frame records of a task without ``demo_record``: every array of a dict observation as
    ``observation.<key>``, or an array observation as ``observation.state``."""
    if isinstance(observation, Mapping):
        state = {f"observation.{k}": np.asarray(v) for k, v in observation.items()
                 if not isinstance(v, Mapping)}
        return RecordedObservation(state=state)
    return RecordedObservation(state={"observation.state": np.asarray(observation)})


def default_success(info: Mapping[str, Any]) -> bool | None:
    """The success of a task without ``demo_success``: ``info["success"]`` or ``info["is_success"]``; None when
    the info holds neither."""
    for key in ("success", "is_success"):
        if key in info:
            return as_bool_verdict(info[key], f"info[{key!r}]")
    return None


def recorder_of(env: object) -> Callable[[Any], RecordedObservation]:
    """What records a frame of ``env``'s task: its ``demo_record`` (:class:`RecordsObservation`), else
    :func:`default_record`. (A task's recorder returns what it returns; the executor checks it.)"""
    recorder = task_capability(env, RecordsObservation)
    return recorder.demo_record if recorder is not None else default_record


def success_check(env: object) -> Callable[[Any, Mapping[str, Any]], bool | None]:
    """The success check of ``env``'s task on (observation, info): its ``demo_success`` as one bool
    (:class:`ChecksSuccess`), else :func:`default_success` of the info (None: the info says nothing)."""
    judge = task_capability(env, ChecksSuccess)
    if judge is None:
        return lambda _observation, info: default_success(info)
    return lambda observation, info: as_bool_verdict(judge.demo_success(observation, info), "demo_success")


def draw_randomization(env: object, seed: int, variant: int = 0) -> Mapping[str, Any] | None:
    """What ``env``'s task draws for ``seed`` (:class:`Randomizes`), in appearance ``variant`` (0: the seed's own
    scene; another needs :class:`RandomizesVariants`); None for a task that randomizes nothing."""
    if not variant:
        plain = task_capability(env, Randomizes)
        return None if plain is None else plain.demo_randomize(seed)
    drawer = task_capability(env, RandomizesVariants)
    if drawer is None:
        return None
    try:
        inspect.signature(drawer.demo_randomize).bind(seed, variant)
    except TypeError:
        raise TaskProtocolError(f"{type(drawer).__name__}.demo_randomize takes no appearance variant (asked for "
                                f"variant {variant})") from None
    return drawer.demo_randomize(seed, variant)


def iter_segments(env: Any, task: str) -> Iterator[Segment]:
    """The task's plan as a lazy stream of type-checked :class:`Segment` objects.

    Each item is produced only when asked for, so a generator plans from the state the previous segment
    left. A bare list of actions from ``create_demo_action_list`` becomes one ``"legacy"`` segment.
    """
    planner = task_capability(env, SegmentTask)
    if planner is not None:
        plan: Any = planner.create_demo_segments()
        if isinstance(plan, Segment):
            plan = (plan,)
        elif not isinstance(plan, Iterable) or isinstance(plan, (str, bytes, Mapping)):
            raise TaskProtocolError(f"create_demo_segments returned {type(plan).__name__}; expected a "
                                    "Segment, an iterable of Segments or a generator", task=task)
        for index, item in enumerate(plan):
            if not isinstance(item, Segment):
                raise TaskProtocolError(f"create_demo_segments yielded item {index} of type "
                                        f"{type(item).__name__} ({item!r:.80}); expected Segment", task=task)
            if not isinstance(item.name, str) or not item.name:
                raise TaskProtocolError(f"segment {index} has no name", task=task)
            check_json_safe(dict(item.metadata), f"segment {index} ({item.name!r}) metadata")
            yield item
        return
    legacy = task_capability(env, ActionListTask)
    if legacy is not None:
        yield Segment(actions=legacy.create_demo_action_list(), name=LEGACY_SEGMENT_NAME)
        return
    raise TaskProtocolError(f"{type(env).__name__} has neither create_demo_segments() nor "
                            "create_demo_action_list() in its wrapper chain", task=task)
