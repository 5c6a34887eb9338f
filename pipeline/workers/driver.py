"""The driver side of a scale-out executor: leases episodes to remote workers and feeds their pieces into
the write stage's input, in place of the in-process step and encode stages.

::

    plan ──> LeaseBroker ──lease──> worker k (process / Ray actor): step, render, encode
                  ^                       │ pieces (bounded: max_in_flight per worker)
                  │ re-runs               v
                  └──────────────── slot k ──records──> write ──> commit ──(discard done)──┘

A worker that dies loses only its in-flight attempt: the driver ends it as ``interrupted`` (not counted,
discarded by the commit stage like recovery after a crash) and, once the commit stage has deleted its
staged folder, leases the same attempt number (same episode id, same seed) again, to a live or replacement
worker. Waiting for the discard matters: the re-run writes to the same staging folder.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.pipeline.job import JobSpec
from demoforge.pipeline.tasks.registry import TaskInfo, get_task
from demoforge.pipeline.workers.config import (
    ExecutorConfig,
    ExecutorError,
    ExecutorUnavailableError,
    NoWorkersError,
    WorkersLostError,
    WorkerStartError,
)
from demoforge.pipeline.workers.episode_worker import Piece, WorkerSpec, task_modules_for
from demoforge.pipeline.workers.process_backend import ProcessBackend, WorkerLost
from demoforge.stages.attempts import AttemptLedger, RetryPolicy
from demoforge.stages.records import (
    AttemptEnded,
    AttemptKey,
    EpisodeAbandoned,
    EpisodeAssignment,
    StagedAttempt,
)
from demoforge.stages.context import StageContext
from demoforge.stages.recipe import WorkerRecipe
from demoforge.stages.step import StepTimeoutError

UNPLACED_NOTICE_S = 2.0  # a start still unplaced then and a second later is said to wait for room
STARVED_NOTICE_S = 10.0  # no worker running for this long: one line (the job stops at --start-timeout)
START_RETRY_S = 1.0  # pause before a slot whose worker failed to start tries again


class WorkerHandle(Protocol):
    pid: int | None
    host: str

    @property
    def name(self) -> str: ...

    async def ready(self) -> None: ...  # until started; WorkerStartError if it cannot; cancelling cancels the start

    async def unplaced(self) -> str | None: ...  # why it still waits for room in the cluster; None once placed

    def pieces(self, lease: EpisodeAssignment) -> AsyncIterator[Piece]: ...  # raises WorkerLost when it dies

    def kill(self) -> None: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    kind: str

    async def connect(self) -> str: ...

    async def start_worker(self, slot: int, spec: WorkerSpec) -> WorkerHandle: ...  # begun, not ready

    async def lacks_room(self) -> str | None: ...  # what the cluster lacks for one more worker; None: room

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class WorkerCount:
    """Remote workers running now, the most the job runs at once (``--workers``), and how many were lost."""

    running: int
    wanted: int
    lost: int


def make_backend(config: ExecutorConfig) -> Backend:
    if config.kind == "process":
        return ProcessBackend(config)
    if config.kind == "ray":
        try:
            from demoforge.pipeline.workers.ray_backend import RayBackend
        except ImportError as exc:  # ray itself is missing (the module imports it lazily; this is belt and braces)
            raise ExecutorUnavailableError(f"--executor ray needs Ray: {exc}") from None
        return RayBackend(config)
    raise ValueError(f"executor {config.kind!r} does not run remote workers")


class LeaseBroker:
    """Hands out work: re-runs of lost attempts first, then the planner's assignments.

    It takes an assignment from the planner only while a worker is asking, so the planner's rendezvous
    semantics (no offer left waiting in a queue) hold. ``None`` means no more work: the job was stopped, or
    the plan has ended and no lease runs, no re-run is queued and none can still appear (a lease that runs
    may yet lose its worker and come back as a re-run)."""

    def __init__(self, receive: MemoryObjectReceiveStream[EpisodeAssignment], stop: threading.Event) -> None:
        self._receive = receive
        self._stop = stop
        self.retries: deque[EpisodeAssignment] = deque()
        self.held: deque[EpisodeAssignment] = deque()
        self.pending = 0  # lost attempts whose discard has not completed yet
        self.leased = 0  # leases a worker is running now
        self.plan_done = False
        self.asking = 0
        self._changed = anyio.Event()

    def wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def finished(self) -> bool:
        if self._stop.is_set():
            return self.leased == 0
        return self.plan_done and not (self.pending or self.leased or self.retries or self.held)

    async def wait_finished(self) -> None:
        while not self.finished:
            await self._changed.wait()

    async def run(self) -> None:
        async with self._receive:
            while True:
                while not (self.asking > len(self.held) + len(self.retries)):
                    await self._changed.wait()
                try:
                    item = await self._receive.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    self.plan_done = True
                    self.wake()
                    return
                self.held.append(item)
                self.wake()

    async def request(self) -> EpisodeAssignment | None:
        """The next lease for a worker (count it done with :meth:`release`), or None: no more work."""
        self.asking += 1
        self.wake()
        try:
            while True:
                if self._stop.is_set():
                    return None
                if self.retries or self.held:
                    self.leased += 1
                    return (self.retries or self.held).popleft()
                if self.finished:
                    return None
                await self._changed.wait()
        finally:
            self.asking -= 1

    def release(self) -> None:
        """A lease has ended: its records are forwarded, or its lost worker's attempt is handed back."""
        self.leased -= 1
        self.wake()

    def rerun(self, assignment: EpisodeAssignment) -> None:
        self.retries.append(assignment)
        self.wake()


@dataclass
class _Lease:
    """What the driver knows of one leased episode from the records it has forwarded."""

    assignment: EpisodeAssignment
    next_attempt: int
    ledger: AttemptLedger = field(default_factory=AttemptLedger)  # the attempts in flight
    finished: bool = False
    hung: bool = False

    def track(self, record: Any) -> None:
        self.ledger.track(record)
        if isinstance(record, AttemptEnded):
            result = record.result
            if result.committable:
                self.finished = True
            else:
                self.next_attempt = record.key.attempt + (1 if result.counts_as_attempt else 0)
        elif isinstance(record, EpisodeAbandoned):
            self.finished = True


class RemoteExecutor:
    """Runs a job's env workers remotely, up to ``config.workers`` at once. :meth:`started` connects and
    starts them (its body runs once one is ready, before the store is opened); :meth:`run` is the stage;
    :meth:`attempt_outcome` is called by the commit stage's callback.

    Elastic: every worker slot starts a worker, serves leases until the worker is lost, and starts another.
    A start that waits for room in the cluster is no error while another worker runs (the job carries on
    with fewer and says so; the worker joins when the cluster places it, such as when a node joins). With no
    worker running for ``start_timeout_s`` the job stops (:class:`NoWorkersError`). The stage ends as soon as
    no more work can appear; leaving :meth:`started` cancels the starts still waiting."""

    def __init__(self, config: ExecutorConfig, recipe: WorkerRecipe, spec: JobSpec, info: TaskInfo,
                 on_event: Callable[[str], None] | None = None,
                 on_workers: Callable[[WorkerCount], None] | None = None) -> None:
        if recipe.num_envs != 1:
            raise ExecutorError(f"--num-envs {recipe.num_envs} applies to the thread executor; the {config.kind} "
                                "executor runs one env per worker: use more workers instead")
        self.config = config
        self.recipe = recipe
        self.backend = make_backend(config)
        self.spec = WorkerSpec(recipe, task_options=dict(info.options), batch_frames=config.batch_frames,
                               task_modules=task_modules_for(get_task(spec.task)), rerender=spec.rerender)
        self.on_event = on_event or (lambda _line: None)
        self.on_workers = on_workers or (lambda _count: None)
        self.workers: dict[int, WorkerHandle] = {}  # the ready ones, by slot
        self.losses = 0
        self.max_losses = 3 * config.workers + 3
        self._awaiting_discard: dict[AttemptKey, EpisodeAssignment] = {}
        self._broker: LeaseBroker | None = None
        self._send: MemoryObjectSendStream[Any] | None = None
        self._stop: threading.Event | None = None
        self._stopping = False
        self._serving = anyio.Event()  # run() has begun: ready workers take leases
        self._first_ready = anyio.Event()
        self._tg: TaskGroup | None = None
        # No piece for this long from a worker that has room to send one: its env hangs (see _serve).
        self._piece_timeout_s = None if recipe.step_timeout_s is None else recipe.step_timeout_s + 5.0

    # ------------------------------------------------------------------------------ start / close
    @asynccontextmanager
    async def started(self) -> AsyncIterator[RemoteExecutor]:
        """Connect the backend and start the worker slots; the body runs once a worker is ready (or a clear
        error is raised: a worker that cannot start, no worker placed in time). Leaving it cancels any start
        still waiting and closes every worker."""
        try:
            detail = await self.backend.connect()
            self.on_event(f"executor {self.config.kind}: {detail}")
            self._publish()
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for slot in range(self.config.workers):
                    tg.start_soon(self._slot, slot)
                tg.start_soon(self._watch_starved)
                await self._first_ready.wait()
                yield self
                tg.cancel_scope.cancel()  # the job is over: starts still waiting for room are cancelled
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for worker in list(self.workers.values()):
                worker.kill()
            for worker in list(self.workers.values()):
                await worker.aclose()
            self.workers.clear()
            await self.backend.aclose()

    def _publish(self) -> None:
        self.on_workers(WorkerCount(running=len(self.workers), wanted=self.config.workers, lost=self.losses))

    def _running(self) -> str:
        return f"{len(self.workers)} of {self.config.workers} worker(s) running"

    async def _slot(self, slot: int) -> None:
        """One place for a worker: start one, serve leases until it is lost, start another; ends with the job."""
        replacing = False
        while True:
            worker = await self._start(slot, replacing)
            if worker is None:  # it could not start; counted as a loss, tried again
                continue
            await self._serving.wait()
            if not await self._serve(slot, worker) or self._stopping:
                return
            replacing = True

    async def _start(self, slot: int, replacing: bool) -> WorkerHandle | None:
        worker = await self.backend.start_worker(slot, _with_worker(self.spec, slot))
        notice = anyio.CancelScope()
        assert self._tg is not None
        self._tg.start_soon(self._say_if_unplaced, slot, worker, notice)
        try:
            await worker.ready()
        except WorkerStartError as exc:
            with anyio.CancelScope(shield=True):
                await worker.aclose()
            if not self._first_ready.is_set():
                raise  # nothing runs yet: the job cannot start (the store is not touched)
            self._count_loss(str(exc), f"{exc}; the job carries on ({self._running()}) and tries again")
            await anyio.sleep(START_RETRY_S)
            return None
        finally:
            notice.cancel()
        self.workers[slot] = worker
        self._publish()
        if replacing:
            self.on_event(f"{worker.name} replaces a lost worker, on {worker.host} ({self._running()})")
        else:
            joins = ", joining the run" if self._serving.is_set() else ""
            self.on_event(f"{worker.name} ready on {worker.host}{joins} ({self._running()})")
        self._first_ready.set()
        return worker

    async def _say_if_unplaced(self, slot: int, worker: WorkerHandle, scope: anyio.CancelScope) -> None:
        """One line when a start waits for room in the cluster while other workers run (again if their number
        changes). Unplaced on two checks in a row: a worker process that is only slow to start looks unplaced
        for a moment. With no worker running, :meth:`_watch_starved` speaks instead."""
        with scope:
            said_for: int | None = None  # how many workers ran when the last line was printed
            streak = 0
            await anyio.sleep(UNPLACED_NOTICE_S - 1.0)
            while True:
                await anyio.sleep(1.0)
                why = await worker.unplaced() if self.workers else None
                streak = streak + 1 if why is not None else 0
                if streak >= 2 and len(self.workers) != said_for:
                    said_for = len(self.workers)
                    self.on_event(f"worker {slot} waits for room: {why}; the job carries on with {self._running()} "
                                  "and starts it when the cluster has room")

    async def _watch_starved(self) -> None:
        """No worker running for ``start_timeout_s`` while work remains: stop with a clear error (exit 1).
        Says so once when none has run for ``STARVED_NOTICE_S``."""
        since = time.monotonic()
        said = False
        while True:
            await anyio.sleep(0.2)
            broker = self._broker
            if self.workers or self._stopping or (broker is not None and broker.finished):
                since, said = time.monotonic(), False
                continue
            if not said and time.monotonic() - since >= STARVED_NOTICE_S:
                said = True
                self.on_event(f"no worker runs yet{await self._room()}; the job stops if none has started within "
                              f"{self.config.start_timeout_s:g} s (--start-timeout)")
            if time.monotonic() - since < self.config.start_timeout_s:
                continue
            room = await self._room()
            limit = f"{self.config.start_timeout_s:g} s (--start-timeout)"
            if not self._serving.is_set():
                raise NoWorkersError(f"no worker could be started within {limit}{room}. Nothing was written; "
                                     "give the cluster room (or lower --cpus-per-worker) and run the command again")
            raise NoWorkersError(f"every worker was lost and none could be started again within {limit}{room}. "
                                 "Committed episodes are kept: re-run the same command to resume.")

    async def _room(self) -> str:
        why = await self.backend.lacks_room()
        return f": {why}" if why else ""

    def _count_loss(self, why: str, line: str | None = None) -> None:
        self.losses += 1
        self._publish()
        if line is not None:
            self.on_event(line)
        if self.losses > self.max_losses:
            raise WorkersLostError(f"{self.losses} workers were lost (the last: {why}); stopping. Committed "
                                   "episodes are kept: re-run the same command to resume.")

    # ------------------------------------------------------------------------------ the stage
    def start(self, tg: TaskGroup, assignments: MemoryObjectReceiveStream[EpisodeAssignment],
              send: MemoryObjectSendStream[Any], context: StageContext) -> None:
        tg.start_soon(self.run, assignments, send, context)

    async def run(self, assignments: MemoryObjectReceiveStream[EpisodeAssignment], send: MemoryObjectSendStream[Any],
                  context: StageContext) -> None:
        stop = context.stop
        broker = self._broker = LeaseBroker(assignments, stop)
        self._send, self._stop = send, stop
        async with send, anyio.create_task_group() as tg:
            tg.start_soon(broker.run)
            tg.start_soon(self._watch_stop, stop, broker)
            self._serving.set()
            await broker.wait_finished()  # the slots serve the leases; pending starts do not hold the job up
            tg.cancel_scope.cancel()

    async def _watch_stop(self, stop: threading.Event, broker: LeaseBroker) -> None:
        """``stop()`` ends in-flight attempts now: kill the workers; their attempts end as interrupted."""
        while not stop.is_set():
            await anyio.sleep(0.05)
        self._stopping = True
        for worker in list(self.workers.values()):
            worker.kill()
        broker.wake()

    async def _serve(self, slot: int, worker: WorkerHandle) -> bool:
        """Leases for one worker until no work is left (False) or the worker is lost (True)."""
        broker, send, stop = self._broker, self._send, self._stop
        assert broker is not None and send is not None and stop is not None
        while True:
            lease = await broker.request()
            if lease is None:
                return False
            state = _Lease(lease, lease.first_attempt)
            try:
                pieces = worker.pieces(lease)
                while True:
                    # A worker with room to run ahead sends a piece at least every MAX_PIECE_SECONDS plus one
                    # env step: none within the step timeout means its env hangs.
                    with anyio.move_on_after(self._piece_timeout_s) as waited:
                        try:
                            piece = await pieces.__anext__()
                        except StopAsyncIteration:
                            break
                    if waited.cancelled_caught:
                        worker.kill()
                        await self._hung(worker, state, send, broker)
                        raise WorkerLost(f"{worker.name} hung")
                    for record in piece.records:
                        await send.send(record)
                        state.track(record)
            except WorkerLost as exc:
                if not state.hung:
                    await self._lost(worker, state, str(exc), send, broker)
                del self.workers[slot]
                self._publish()
                await worker.aclose()
                if not (self._stopping or stop.is_set()):
                    self._count_loss(str(exc))
                return True
            finally:
                broker.release()

    async def _lost(self, worker: WorkerHandle, state: _Lease, why: str, send: MemoryObjectSendStream[Any],
                    broker: LeaseBroker) -> None:
        """End the lost worker's attempt as interrupted and schedule its re-run (after the discard)."""
        if not self._stopping:
            self.on_event(f"{why}; its in-flight attempt is discarded and re-run")
        for attempt in state.ledger.in_flight():
            key = attempt.key
            if not self._stopping:
                self._awaiting_discard[key] = EpisodeAssignment(key.episode_index, key.attempt)
                broker.pending += 1
            await send.send(attempt.ended(attempt.interrupted(self.recipe.task, f"interrupted: {why}")))
        if not state.ledger and not state.finished and not self._stopping:
            broker.rerun(EpisodeAssignment(state.assignment.episode_index, state.next_attempt))

    async def _hung(self, worker: WorkerHandle, state: _Lease, send: MemoryObjectSendStream[Any],
                    broker: LeaseBroker) -> None:
        """Like the thread executor's watchdog: the hung attempt ends as an error (counted) and the episode
        continues with its next attempt on another worker."""
        state.hung = True
        timeout = self.recipe.step_timeout_s
        self.on_event(f"{worker.name} sent nothing for {self._piece_timeout_s:g} s (step timeout {timeout:g} s); "
                      "its attempt is aborted and the worker replaced")
        if not state.ledger:  # hung before its attempt started (building or resetting the env): re-run as lost
            broker.rerun(EpisodeAssignment(state.assignment.episode_index, state.next_attempt))
            return
        error = StepTimeoutError(f"the env did not return within {timeout:g} s; attempt aborted and the worker "
                                 "replaced", task=self.recipe.task)
        for ended, then in state.ledger.end_all_failed(self.recipe.task, error, RetryPolicy(self.recipe.max_attempts)):
            await send.send(ended)
            if isinstance(then, EpisodeAssignment):
                broker.rerun(then)
            else:
                await send.send(then)

    def attempt_outcome(self, item: StagedAttempt) -> None:
        """The commit stage finished with an attempt; a lost one may now be re-run (its folder is gone)."""
        assignment = self._awaiting_discard.pop(item.ended.key, None)
        if assignment is None or self._broker is None:
            return
        self._broker.pending -= 1
        if not self._stopping:
            self._broker.rerun(assignment)
        else:
            self._broker.wake()


def _with_worker(spec: WorkerSpec, slot: int) -> WorkerSpec:
    from dataclasses import replace

    return replace(spec, worker=slot)
