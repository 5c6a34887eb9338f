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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import gymnasium as gym
import numpy as np

from demoforge.stages.contract import (
    LEGACY_SEGMENT_NAME,
    RecordedObservation,
    Segment,
    TaskProtocolError,
    check_json_safe,
)

__all__ = ["ActionListTask", "ChecksSuccess", "GivesInstruction", "HoldsAction", "Randomizes",
           "RecordsObservation", "SeedsAttempt", "SegmentTask", "SelectsEpisode", "iter_segments", "task_capability"]

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
