"""Walking a task's plan: segments planned one at a time from the state the previous one left, each one's
actions in turn, and its validator when its actions run out.

The executor records an attempt by walking the plan this way and ``demoforge replay`` walks it again beside
the recording; both use this one cursor, so what replay checks is what the executor did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from demoforge.stages.contract import Segment, as_bool_verdict
from demoforge.stages.task_protocol import iter_segments

END: Any = object()
"""What :meth:`SegmentCursor.next_action` returns when the current segment has no more actions."""

TaskCall = Callable[..., Any]
"""``call(what, fn, *args)`` runs ``fn(*args)``, a piece of the task's own code named by ``what``: how its
failure is handled is the caller's (the executor raises a ``TaskError``; replay notes it and stops following)."""


def direct_call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class SegmentCursor:
    """The current segment of a task's plan and the position in its actions.

    ``segment`` is ``None`` before :meth:`start` and after the plan ends; ``segment_id`` counts the segments
    planned so far from 0."""

    def __init__(self, env: Any, task: str, call: TaskCall = direct_call) -> None:
        self.env, self.task, self._call = env, task, call
        self._plan: Iterator[Segment] | None = None
        self._actions: Iterator[Any] | None = None
        self.segment: Segment | None = None
        self.segment_id = -1

    def start(self) -> bool:
        """Plan the episode (after reset) and its first segment; False when the plan is empty."""
        self._plan = self._call("create_demo_segments", iter_segments, self.env, self.task)
        return self.next_segment()

    def next_segment(self) -> bool:
        """Plan the next segment from the env's current state; False when the plan has ended (or failed in a
        caller's ``call`` that does not raise)."""
        plan = self._plan
        segment = None if plan is None else self._call("planning the next segment", next, plan, END)
        if segment is END or segment is None:
            self.segment, self._actions = None, None
            return False
        self.segment, self.segment_id = segment, self.segment_id + 1
        self._actions = iter(segment.actions)
        return True

    def next_action(self) -> Any:
        """The current segment's next action as the task gave it, or :data:`END` when it has no more."""
        actions, segment = self._actions, self.segment
        if actions is None or segment is None:
            return END
        return self._call(f"segment {segment.name!r} action generator", next, actions, END)

    def validate(self, view: Any) -> bool:
        """The current segment's validator on the state its actions left (True for a segment without one)."""
        segment = self.segment
        if segment is None or segment.validator is None:
            return True
        what = f"segment {segment.name!r} validator"
        validator = segment.validator
        return bool(self._call(what, lambda: as_bool_verdict(validator(view), what)))
