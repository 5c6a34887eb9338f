"""Plan stage: hands out episode indices until the job's target of committed episodes is reached.

Segments themselves are planned lazily inside the step stage (a task plans each segment from the state the
previous one left, which only the env worker can see); this stage plans *which* episodes run, with which
first attempt, so a resumed job skips what is committed and continues interrupted attempts with the same
attempt number and seed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from demoforge.stages.records import EpisodeAssignment, EpisodeLayout
from demoforge.stages.settings import DEFAULT_MAX_CONSECUTIVE_ABANDONED
from demoforge.storage.catalog import ResumeState


@dataclass(frozen=True)
class RunawayStop:
    """Why a job (or one task of a suite) stopped: its last ``consecutive`` episodes were all abandoned."""

    consecutive: int
    limit: int
    top_reasons: tuple[tuple[str, int], ...]  # discard reasons of the streak's attempts, most frequent first
    last_error: str
    group: int = 0  # the suite member that ran away (0 for a job of one task)


class EpisodePlanner:
    """Tracks committed and in-flight episode indices; the commit stage reports each episode's end.

    ``target`` is per member of the ``layout`` (a job of one task has one member): a suite plans its members in
    blocks, member after member, so each worker builds each member's env about once, and an abandoned episode
    is replaced by another index of the same member. ``max_consecutive_abandoned`` (0: no limit) stops planning
    a member when that many of its episodes in a row were abandoned (a task that always fails would otherwise
    run forever); the other members of a suite go on, and the job stops when no member is left to plan."""

    def __init__(self, target: int, resume: ResumeState, max_attempts: int,
                 max_consecutive_abandoned: int = DEFAULT_MAX_CONSECUTIVE_ABANDONED,
                 layout: EpisodeLayout | None = None, index_limit: int | None = None) -> None:
        self.layout = layout or EpisodeLayout()
        # A fixed set of episodes (a rerender, an evaluation: indices 0..limit-1 of each member, each run once):
        # abandoned ones are not replaced
        self.index_limit = index_limit
        self.target = target
        self.max_consecutive_abandoned = max_consecutive_abandoned
        self._streak: Counter[int] = Counter()  # per member: episodes abandoned in a row
        self._streak_reasons: dict[int, Counter[str]] = {}  # per member: discard reasons since its last commit
        self._last_error: dict[int, str] = {}
        self.given_up: dict[int, RunawayStop] = {}  # members that ran away: planned no more
        self.runaway: RunawayStop | None = None  # the last member to run away (the job's, for one task)
        self.committed = set(resume.committed)
        self.spent = dict(resume.spent_attempts)
        self.max_attempts = max_attempts
        self.in_flight: set[int] = set()
        self.abandoned: set[int] = set()
        self.quarantined = set(resume.quarantined)  # lost to corruption: replaced by new indices
        self._changed = anyio.Event()
        self._stopped = False
        self.paused = False
        self._next = [self.layout.index(group, 0) for group in range(self.layout.groups)]  # per member
        self._committed_in = Counter(self.layout.group(i) for i in self.committed)
        self._offer: anyio.CancelScope | None = None  # the send waiting for a worker, withdrawn on pause

    @property
    def done(self) -> bool:
        """Every member that is still planned has its target (or, with an index limit, every index has run)."""
        if self.index_limit is not None and not self.in_flight and all(
                self._next_index(g) >= self.layout.index(g, self.index_limit) for g in range(self.layout.groups)):
            return True
        return all(self._committed_in[group] >= self.target for group in range(self.layout.groups)
                   if group not in self.given_up)

    def committed_of(self, group: int) -> int:
        return self._committed_in[group]

    def finished(self, episode_index: int, committed: bool, last_error: str = "") -> None:
        self.in_flight.discard(episode_index)
        if committed and episode_index not in self.committed:
            self._committed_in[self.layout.group(episode_index)] += 1
        (self.committed if committed else self.abandoned).add(episode_index)
        group = self.layout.group(episode_index)
        if committed:
            self._streak[group] = 0
            self._streak_reasons.pop(group, None)
        else:
            self._streak[group] += 1
            self._last_error[group] = last_error or self._last_error.get(group, "")
            limit = self.max_consecutive_abandoned
            if limit and self._streak[group] >= limit and group not in self.given_up:
                reasons = self._streak_reasons.get(group, Counter())
                self.runaway = self.given_up[group] = RunawayStop(
                    self._streak[group], limit, tuple(reasons.most_common(3)), self._last_error[group] or "?", group)
                if len(self.given_up) == self.layout.groups:
                    self.stop()  # no member is left to plan
        self._wake()

    def attempt_discarded(self, reason: str, episode_index: int = 0) -> None:
        """Count a discarded attempt's reason toward its member's streak (reported if the member runs away)."""
        self._streak_reasons.setdefault(self.layout.group(episode_index), Counter())[reason[:120]] += 1

    def stop(self) -> None:
        """Start no more episodes; the plan stream closes, so workers finish what they hold and end."""
        self._stopped = True
        self._withdraw()
        self._wake()

    def set_paused(self, paused: bool) -> None:
        """While paused no new episode starts (in-flight ones finish); used when disk space runs low."""
        self.paused = paused
        if paused:
            self._withdraw()
        self._wake()

    def _withdraw(self) -> None:
        if self._offer is not None:
            self._offer.cancel()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _next_index(self, group: int) -> int:
        index = self._next[group]
        while index in self.committed or index in self.quarantined or self.spent.get(index, 0) >= self.max_attempts:
            index += 1
        self._next[group] = index
        return index

    def _group_to_plan(self) -> int | None:
        """The first member whose committed and in-flight episodes are below the target, if any."""
        in_flight = Counter(self.layout.group(i) for i in self.in_flight)
        for group in range(self.layout.groups):
            limit = self.index_limit
            if limit is not None and self._next_index(group) >= self.layout.index(group, limit):
                continue
            if group not in self.given_up and self._committed_in[group] + in_flight[group] < self.target:
                return group
        return None

    async def run(self, send: MemoryObjectSendStream[EpisodeAssignment]) -> None:
        """The stage: send assignments while committed + in-flight is below the target."""
        async with send:
            while not self._stopped and not self.done:
                group = None if self.paused else self._group_to_plan()
                if group is None:
                    await self._changed.wait()
                    continue
                index = self._next_index(group)
                self.in_flight.add(index)
                # The stream has no buffer: an offer is taken by a worker or withdrawn (pause, stop), never
                # left waiting in a queue where a pause could not reach it.
                with anyio.CancelScope() as offer:
                    self._offer = offer
                    try:
                        await send.send(EpisodeAssignment(index, self.spent.get(index, 0)))
                    except anyio.BrokenResourceError:  # every env worker has stopped: nobody to plan for
                        self.in_flight.discard(index)
                        return
                    finally:
                        self._offer = None
                if offer.cancelled_caught:
                    self.in_flight.discard(index)
                    continue
                self._next[group] = index + 1
