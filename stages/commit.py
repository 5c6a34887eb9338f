"""Commit stage: the only place an attempt becomes data or is thrown away.

A failure kept as data (``generate --keep-failures``) is committed the same way, flagged in its catalog row:
it is an episode of its own that fills no slot of the job.

The order that makes a crash harmless (fsync, then flip the catalog row; a discard flips first, then deletes)
is the store's: ``Store.commit_attempt`` and ``Store.discard_attempt`` (storage/store.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from demoforge.stages.context import StageContext
from demoforge.stages.contract import EpisodeResult
from demoforge.stages.records import EpisodeAbandoned, StagedAttempt, StagedRecord
from demoforge.storage.provenance import library_versions
from demoforge.storage.store import Store


class CommitListener(Protocol):
    """Told each outcome: the job's planner (stages/plan.py EpisodePlanner), or a recorder's waiting callers."""

    def finished(self, episode_index: int, committed: bool, last_error: str = "") -> None: ...

    def attempt_discarded(self, reason: str, episode_index: int = 0) -> None: ...


async def commit_stage(receive: MemoryObjectReceiveStream[StagedRecord], *, store: Store,
                       planner: CommitListener,
                       on_outcome: Callable[[StagedAttempt], None] | None = None,
                       context: StageContext | None = None) -> None:
    context = context or StageContext()
    async with receive:
        async for item in receive:
            if isinstance(item, EpisodeAbandoned):
                planner.finished(item.episode_index, committed=False, last_error=item.last_reason)
                continue
            if not isinstance(item, StagedAttempt):
                continue
            ended = item.ended
            result = ended.result
            mark = time.perf_counter()
            episode_id = ended.key.episode_id
            if result.keeps_data:
                await anyio.to_thread.run_sync(functools.partial(
                    store.commit_attempt, episode_id, frames=ended.frames, video_bytes=item.video_bytes,
                    content_hash=item.content_hash or "", record={**result.to_record(), "versions": library_versions()},
                    kept_failure=result.kept))
                if result.committable:
                    planner.finished(ended.key.episode_index, committed=True)
                else:  # a failure kept as data: its slot is retried (the executor starts the next attempt)
                    planner.attempt_discarded(_reason(result), ended.key.episode_index)
            else:
                await anyio.to_thread.run_sync(functools.partial(
                    store.discard_attempt, episode_id, reason=result.failure_reason or result.terminal_reason.value,
                    terminal_reason=result.terminal_reason.value, counted=result.counts_as_attempt,
                    record=result.to_record()))
                planner.attempt_discarded(_reason(result), ended.key.episode_index)
            context.busy.add("commit", time.perf_counter() - mark)
            if on_outcome is not None:
                on_outcome(item)


def _reason(result: EpisodeResult) -> str:
    return f"{result.terminal_reason.value}: {result.failure_reason}" if result.failure_reason else \
        result.terminal_reason.value
