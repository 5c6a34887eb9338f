"""The attempt ledger: what a worker knows of its attempts in flight, the end it gives an attempt that cannot
end itself, and the one rule for what follows an attempt that did not commit.

Worker threads (stages/step.py), the driver of process workers and Ray actors (pipeline/workers/driver.py) and
a process worker itself (pipeline/workers/episode_worker.py) all track attempts and end them the same way when
an env hangs, a worker is lost or an exception escapes the executor; the executor (stages/executor.py)
retries by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from demoforge.stages.contract import EpisodeResult, TerminalReason
from demoforge.stages.records import (
    AttemptEnded,
    AttemptKey,
    AttemptStarted,
    EncodedFrame,
    EpisodeAbandoned,
    EpisodeAssignment,
    Frame,
)


@dataclass
class InFlightAttempt:
    """An attempt that has started and not ended: its seed and env row, and the frames recorded so far."""

    key: AttemptKey
    seed: int
    row: int
    frames: int = 0

    def failed(self, task: str, error: str, error_type: str) -> EpisodeResult:
        """Its end as an error the executor could not report itself (a hung env, an exception in a worker):
        counted as an attempt."""
        return self._ended(task, TerminalReason.ERROR, error, error_type)

    def interrupted(self, task: str, why: str) -> EpisodeResult:
        """Its end when its worker was lost: not counted, so it is re-run with the same number and seed."""
        return self._ended(task, TerminalReason.INTERRUPTED, why, "WorkerLostError")

    def _ended(self, task: str, reason: TerminalReason, error: str, error_type: str) -> EpisodeResult:
        key = self.key
        return EpisodeResult(task=task, episode_index=key.episode_index, attempt=key.attempt, seed=self.seed,
                             row=self.row, length=self.frames, completed=False, success=False, terminated=False,
                             truncated=False, terminal_reason=reason, segments=(), error=error, error_type=error_type)

    def ended(self, result: EpisodeResult) -> AttemptEnded:
        return AttemptEnded(key=self.key, result=result, frames=self.frames)


class AttemptLedger:
    """The attempts in flight, kept from the records a worker produces or forwards."""

    def __init__(self) -> None:
        self._active: dict[AttemptKey, InFlightAttempt] = {}

    def track(self, record: object) -> None:
        if isinstance(record, AttemptStarted):
            self._active[record.key] = InFlightAttempt(record.key, record.seed, record.row)
        elif isinstance(record, (Frame, EncodedFrame)):
            attempt = self._active.get(record.key)
            if attempt is not None:
                attempt.frames += 1
        elif isinstance(record, AttemptEnded):
            self._active.pop(record.key, None)

    def in_flight(self) -> list[InFlightAttempt]:
        """Oldest episode first."""
        return [self._active[key] for key in sorted(self._active, key=lambda k: (k.episode_index, k.attempt))]

    def end_all_failed(self, task: str, error: BaseException,
                       retry: RetryPolicy) -> list[tuple[AttemptEnded, EpisodeAssignment | EpisodeAbandoned]]:
        """End every attempt in flight as ``error`` (a hung env: counted), each with what ``retry`` says follows."""
        ends = []
        for attempt in self.in_flight():
            result = attempt.failed(task, str(error), type(error).__name__)
            ends.append((attempt.ended(result), retry.after(attempt.key, result)))
        return ends

    def __bool__(self) -> bool:
        return bool(self._active)


@dataclass(frozen=True)
class RetryPolicy:
    """What follows an attempt that did not commit: the same attempt number again when it does not count (a
    lost worker, a stopped job), the next one while ``max_attempts`` allow, else the episode is given up."""

    max_attempts: int

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def after(self, key: AttemptKey, result: EpisodeResult) -> EpisodeAssignment | EpisodeAbandoned:
        next_attempt = key.attempt + (1 if result.counts_as_attempt else 0)
        if next_attempt < self.max_attempts:
            return EpisodeAssignment(key.episode_index, next_attempt)
        return EpisodeAbandoned(key.episode_index, next_attempt,
                                result.failure_reason or result.terminal_reason.value)
