"""Run a stage as two concurrent halves (taking records in, sending results on) that fail as one stage."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio


async def run_halves(intake: Callable[[], Coroutine[Any, Any, None]],
                     output: Callable[[anyio.CancelScope], Coroutine[Any, Any, None]]) -> None:
    """Run both halves in one task group; ``output`` gets the group's cancel scope to stop the stage when the
    next stage is gone. A single failure is raised as itself, not wrapped in an exception group, so the
    stage fails with its own typed error (EncoderError, a write error) as a sequential stage would."""
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(intake)
            tg.start_soon(output, tg.cancel_scope)
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from group.exceptions[0].__cause__
        raise
