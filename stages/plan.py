"""Plan stage: hands out episode indices until the job's target of committed episodes is reached.

Segments themselves are planned lazily inside the step stage (a task plans each segment from the state the
previous one left, which only the env worker can see); this stage plans *which* episodes run, with which
first attempt, so a resumed job skips what is committed and continues interrupted attempts with the same
attempt number and seed.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from demoforge.pipeline.records import EpisodeAssignment, ResumeState


class EpisodePlanner:
    """Tracks committed and in-flight episode indices; the commit stage reports each episode's end."""

    def __init__(self, target: int, resume: ResumeState, max_attempts: int) -> None:
        self.target = target
        self.committed = set(resume.committed)
        self.spent = dict(resume.spent_attempts)
        self.max_attempts = max_attempts
        self.in_flight: set[int] = set()
        self.abandoned: set[int] = set()
        self.quarantined = set(resume.quarantined)  # lost to corruption: replaced by new indices
        self._changed = anyio.Event()
        self._stopped = False
        self.paused = False
        self._next = 0
        self._offer: anyio.CancelScope | None = None  # the send waiting for a worker, withdrawn on pause

    @property
    def done(self) -> bool:
        return len(self.committed) >= self.target

    def finished(self, episode_index: int, committed: bool) -> None:
        self.in_flight.discard(episode_index)
        (self.committed if committed else self.abandoned).add(episode_index)
        self._wake()

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

    def _next_index(self) -> int:
        while (self._next in self.committed or self._next in self.quarantined
               or self.spent.get(self._next, 0) >= self.max_attempts):
            self._next += 1
        return self._next

    async def run(self, send: MemoryObjectSendStream[EpisodeAssignment]) -> None:
        """The stage: send assignments while committed + in-flight is below the target."""
        async with send:
            while not self._stopped and not self.done:
                if self.paused or len(self.committed) + len(self.in_flight) >= self.target:
                    await self._changed.wait()
                    continue
                index = self._next_index()
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
                self._next = index + 1
