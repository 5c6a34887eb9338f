"""Walking a task's plan: segments planned one at a time from the state the previous one left, each one's
actions in turn, and its validator when its actions run out.

The executor records an attempt by walking the plan this way (:meth:`SegmentCursor.advance` after each step),
``demoforge replay`` walks it again beside the recording with the same :meth:`~SegmentCursor.advance` (ending
segments where the recording did), and rerender and multiply ask it for the task's own segments beside the
ones they substitute: what replay checks is what the executor did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum
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


class Advance(Enum):
    """Where the plan stands after :meth:`SegmentCursor.advance` (or :meth:`SegmentCursor.begin`)."""

    SAME_SEGMENT = "same segment"  # the segment goes on: ``action`` is its next action
    REJECTED = "rejected"  # its actions ran out and its validator rejected the state they left
    NEXT_SEGMENT = "next segment"  # the next segment is planned and ``action`` is its first action
    EMPTY_SEGMENT = "empty segment"  # the next segment is planned and yields no action
    PLAN_ENDED = "plan ended"  # the plan has no more segments


SegmentEnd = Callable[[bool], None]
"""Told whether the validator accepted the segment that ended, before the next one is planned."""


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
        self.action: Any = END  # the action :meth:`next_action` returned last

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
            self.segment, self._actions, self.action = None, None, END
            return False
        self.segment, self.segment_id = segment, self.segment_id + 1
        self._actions = iter(segment.actions)
        return True

    def next_action(self) -> Any:
        """The current segment's next action as the task gave it, or :data:`END` when it has no more."""
        actions, segment = self._actions, self.segment
        if actions is None or segment is None:
            self.action = END
        else:
            self.action = self._call(f"segment {segment.name!r} action generator", next, actions, END)
        return self.action

    def plan_next(self) -> Segment | None:
        """The plan's next segment (its first on the first call), or None when it has ended: for a caller that
        substitutes its own segments for the task's and walks the task's beside them."""
        planned = self.start() if self._plan is None else self.next_segment()
        return self.segment if planned else None

    def begin(self) -> Advance:
        """Plan the episode (after reset), its first segment and that segment's first action: NEXT_SEGMENT,
        EMPTY_SEGMENT, or PLAN_ENDED for a plan without segments."""
        if not self.start():
            return Advance.PLAN_ENDED
        return Advance.NEXT_SEGMENT if self.next_action() is not END else Advance.EMPTY_SEGMENT

    def advance(self, view: Any, *, ends: bool | None = None, on_end: SegmentEnd | None = None,
                stop_if_rejected: bool = True) -> Advance:
        """After a step: the segment's next action; when the segment ends, its validator on the state its actions
        left (``on_end`` is told the verdict), then the next segment planned from that state and its first action.

        A segment ends when its actions run out, or where ``ends`` says (a recording's boundary: replay follows
        the recording whatever the task would do). A rejected segment stops the walk unless ``stop_if_rejected``
        is False."""
        action = self.next_action()
        if not (action is END if ends is None else ends):
            return Advance.SAME_SEGMENT
        accepted = self.validate(view)
        if on_end is not None:
            on_end(accepted)
        if not accepted and stop_if_rejected:
            return Advance.REJECTED
        if not self.next_segment():
            return Advance.PLAN_ENDED
        return Advance.NEXT_SEGMENT if self.next_action() is not END else Advance.EMPTY_SEGMENT

    def validate(self, view: Any) -> bool:
        """The current segment's validator on the state its actions left (True for a segment without one)."""
        segment = self.segment
        if segment is None or segment.validator is None:
            return True
        what = f"segment {segment.name!r} validator"
        validator = segment.validator
        return bool(self._call(what, lambda: as_bool_verdict(validator(view), what)))
