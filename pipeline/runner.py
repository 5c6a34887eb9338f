"""Runs a job to its target: builds the stage graph in one task group, joined by bounded streams.

::

    plan ──assignments──> workers (K env threads, or remote workers) ──encoded──> write ──staged──> commit

Every worker steps its env and encodes its own frames (stages/record_encoder.py), local or remote: a frame
takes one route whatever the executor. Every stream is bounded (``queue_frames`` items), so a slow stage
blocks the ones before it, back to the env workers: nothing is dropped and memory is bounded by the queues,
not by episode or job length.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from demoforge.pipeline.environment import prepare_process
from demoforge.pipeline.flags import control_message
from demoforge.storage.faults import stage_delays
from demoforge.pipeline.job import JobSpec
from demoforge.pipeline.tasks.registry import TaskInfo, get_task
from demoforge.pipeline.workers.config import ExecutorConfig
from demoforge.pipeline.workers.driver import WorkerCount
from demoforge.pipeline.workers.executors import JobExecutor, open_executor
from demoforge.stages.commit import commit_stage
from demoforge.stages.context import BusyMeter, StageContext
from demoforge.stages.control import ControlError, Policy, check_segments
from demoforge.stages.plan import EpisodePlanner, RunawayStop
from demoforge.stages.records import EncodedRecord, EpisodeAssignment, StagedAttempt, StagedRecord
from demoforge.stages.settings import JobConfigError
from demoforge.stages.write import write_stage
from demoforge.storage.recovery import RecoveryReport
from demoforge.storage.store import Store, open_store


@dataclass
class JobStats:
    """Live counters of one run (also what the daemon's metrics read)."""

    target: int
    committed_before: int = 0
    committed: int = 0
    discarded: Counter[str] = field(default_factory=Counter)
    failures_kept: Counter[str] = field(default_factory=Counter)  # this run's, by terminal reason
    failures_kept_before: int = 0
    abandoned: int = 0
    frames: int = 0
    attempts: int = 0
    last_commit_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)
    queues: dict[str, MemoryObjectSendStream[Any]] = field(default_factory=dict)
    busy: BusyMeter = field(default_factory=BusyMeter)  # seconds of work per stage
    # a suite's committed episodes per member task (this run's and earlier runs'); empty for one task
    per_task: Counter[str] = field(default_factory=Counter)
    per_task_target: int = 0  # episodes of each member
    workers: WorkerCount | None = None  # remote workers (process / Ray executors): running, wanted, lost

    @property
    def total_committed(self) -> int:
        return self.committed_before + self.committed

    def frames_per_s(self) -> float:
        elapsed = time.monotonic() - self.started_at
        return self.frames / elapsed if elapsed > 0 else 0.0

    def queue_depths(self) -> dict[str, int]:
        return {name: s.statistics().current_buffer_used for name, s in self.queues.items()}


@dataclass(frozen=True)
class TaskOutcome:
    """One member task of a suite at the end of a run."""

    task: str
    committed: int  # in the store, this run's and earlier runs'
    abandoned: int  # this run
    runaway: RunawayStop | None = None  # set when the member was given up: too many abandoned in a row


@dataclass(frozen=True)
class JobReport:
    store: Path
    target: int
    committed_total: int
    committed_this_run: int
    discarded: dict[str, int]
    abandoned: int
    frames_this_run: int
    elapsed_s: float
    recovery: RecoveryReport
    interrupted: bool
    runaway: RunawayStop | None = None  # set when the job stopped itself: too many episodes abandoned in a row
    # a suite's members, in the suite's order; empty for a job of one task
    per_task: tuple[TaskOutcome, ...] = ()
    workers: WorkerCount | None = None  # remote executors: workers running at the end, the most wanted, lost
    # failed attempts kept as episodes of their own (--keep-failures): this run's by reason, and in all
    failures_kept: dict[str, int] = field(default_factory=dict)
    failures_kept_total: int = 0

    @property
    def complete(self) -> bool:
        return self.committed_total >= self.target


class JobRunner:
    """One run of a job on a store. ``stop()`` (thread-safe) ends it early: in-flight attempts are
    discarded, committed ones kept. ``fixed_episodes``: run episode indices ``0..episodes-1`` once each (of every
    member of a suite) and end, an abandoned episode reported and not replaced (an evaluation: a policy that
    fails an episode has failed it)."""

    def __init__(self, spec: JobSpec, store_dir: Path | str,
                 on_progress: Callable[[JobStats], None] | None = None,
                 on_outcome: Callable[[StagedAttempt], None] | None = None,
                 executor: ExecutorConfig | None = None, on_event: Callable[[str], None] | None = None,
                 fixed_episodes: bool = False) -> None:
        self.spec = spec
        self.executor = executor or ExecutorConfig(workers=spec.workers)
        self.on_event = on_event  # one-line notes of a scale-out executor: workers started, lost, replaced
        self.store_dir = Path(store_dir)
        self.fixed_episodes = fixed_episodes or spec.rerender is not None
        self.entry = get_task(spec.task)
        self.info = self.entry.info(spec.task_options)
        spec.check_control(self.info)  # before any worker or store: a control that cannot apply is refused
        self.make_policy = _check_policy_control(spec, self.info)  # built once here, whatever the executor
        self.layout = spec.layout(self.info)
        self.target = spec.target(self.info)
        self.on_progress = on_progress
        self.on_outcome = on_outcome
        self._stop = threading.Event()
        self._planner: EpisodePlanner | None = None
        self._token: Any = None
        self._loop_thread: int | None = None
        self.stats = JobStats(target=self.target)

    def stop(self) -> None:
        """Stop now: in-flight attempts end as interrupted (discarded); committed ones are kept."""
        self._stop.set()
        self._call_planner(lambda planner: planner.stop())

    def drain(self) -> None:
        """Stop starting episodes; in-flight ones run to their end (retries included) and are committed."""
        self._call_planner(lambda planner: planner.stop())

    def set_paused(self, paused: bool) -> None:
        self._call_planner(lambda planner: planner.set_paused(paused))

    @property
    def paused(self) -> bool:
        return self._planner is not None and self._planner.paused

    def _call_planner(self, fn: Callable[[EpisodePlanner], None]) -> None:
        planner = self._planner
        if planner is None:
            return
        if threading.get_ident() == self._loop_thread:
            fn(planner)
        elif self._token is not None:
            anyio.from_thread.run_sync(fn, planner, token=self._token)

    async def run(self, handle_signals: bool = False) -> JobReport:
        # Workers first: a bad address or task fails before the store is touched. A remote job runs once one
        # worker is ready; the others join as the cluster places them.
        executor = open_executor(self.executor, self.spec, self.info, store_dir=self.store_dir,
                                 make_policy=self.make_policy, on_event=self.on_event, on_workers=self._on_workers)
        async with executor.started():
            return await self._run(executor, handle_signals)

    def _on_workers(self, count: WorkerCount) -> None:
        self.stats.workers = count

    async def _run(self, executor: JobExecutor, handle_signals: bool) -> JobReport:
        context = StageContext(stop=self._stop, busy=self.stats.busy, delays=stage_delays())
        store = await anyio.to_thread.run_sync(functools.partial(open_store, self.store_dir, "w",
                                                                   fingerprint=self.spec.fingerprint(self.info)))
        try:
            planner = self._resume(store)
            q = self.spec.queue_frames
            assign_send, assign_recv = anyio.create_memory_object_stream[EpisodeAssignment](0)
            enc_send, enc_recv = anyio.create_memory_object_stream[EncodedRecord](q)
            write_send, write_recv = anyio.create_memory_object_stream[StagedRecord](q)
            self.stats.queues = {"encode->write": enc_send, "write->commit": write_send}
            on_outcome = functools.partial(self._count_outcome, executor)
            async with anyio.create_task_group() as tg:
                if handle_signals:
                    tg.start_soon(self._watch_signals, tg)
                if planner.done:
                    assign_send.close()
                else:
                    tg.start_soon(planner.run, assign_send)
                # Workers step, render and encode: remote ones send pieces, env threads batches of records.
                executor.start(tg, assign_recv, enc_send, context)
                tg.start_soon(functools.partial(write_stage, enc_recv, write_send, store=store, context=context))
                await commit_stage(write_recv, store=store, planner=planner,
                                   on_outcome=on_outcome, context=context)
                tg.cancel_scope.cancel()  # only the signal watcher can still be running
            return self._report(store, planner)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(store.release_unfinished)
            raise
        finally:
            self._planner = None
            await anyio.to_thread.run_sync(store.close)

    def _resume(self, store: Store) -> EpisodePlanner:
        """The planner of this run, from what the store holds already (the counters start from it too)."""
        spec, stats, members = self.spec, self.stats, self.info.suite
        resume = store.resume_state()
        planner = self._planner = EpisodePlanner(
            spec.episodes, resume, spec.max_attempts, spec.max_consecutive_abandoned, self.layout,
            index_limit=spec.episodes if self.fixed_episodes else None)
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()
        stats.committed_before = len(resume.committed)
        stats.failures_kept_before = store.kept_failure_count()
        if members:
            stats.per_task_target = spec.episodes
            stats.per_task.update({m: 0 for m in members})
            stats.per_task.update(members[self.layout.group(i)] for i in resume.committed)
        return planner

    def _count_outcome(self, executor: JobExecutor, item: StagedAttempt) -> None:
        """The commit stage is done with an attempt: count it, tell the executor, report progress."""
        stats = self.stats
        result = item.ended.result
        if result.committable:
            stats.committed += 1
            stats.frames += item.ended.frames
            if self.info.suite:
                stats.per_task[result.task] += 1
        elif result.kept:
            stats.failures_kept[result.terminal_reason.value] += 1
        else:
            stats.discarded[result.terminal_reason.value] += 1
        stats.attempts += 1
        executor.attempt_outcome(item)  # a lost remote worker's attempt is re-run once its discard is done
        stats.last_commit_at = time.time() if result.committable else stats.last_commit_at
        if self.on_outcome is not None:
            self.on_outcome(item)
        if self.on_progress is not None:
            self.on_progress(stats)

    def _report(self, store: Store, planner: EpisodePlanner) -> JobReport:
        stats = self.stats
        per_task = tuple(TaskOutcome(member, planner.committed_of(g),
                                     sum(1 for i in planner.abandoned if self.layout.group(i) == g),
                                     planner.given_up.get(g))
                         for g, member in enumerate(self.info.suite))
        return JobReport(store=self.store_dir, target=self.target, committed_total=stats.total_committed,
                         committed_this_run=stats.committed, discarded=dict(stats.discarded),
                         abandoned=len(planner.abandoned), frames_this_run=stats.frames,
                         elapsed_s=time.monotonic() - stats.started_at, recovery=store.recovery,
                         interrupted=self._stop.is_set(), runaway=planner.runaway, workers=stats.workers,
                         per_task=per_task, failures_kept=dict(stats.failures_kept),
                         failures_kept_total=stats.failures_kept_before + sum(stats.failures_kept.values()))

    async def _watch_signals(self, tg: TaskGroup) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if self._stop.is_set():
                    raise KeyboardInterrupt  # a second signal: stop now; committed data is already safe
                self._stop.set()
                if self._planner is not None:
                    self._planner.stop()


def _check_policy_control(spec: JobSpec, info: TaskInfo) -> Callable[[], Policy] | None:
    """Refuse what the job's control cannot do with this task (noise in segments it does not have, a policy
    time limit the env watchdog would beat) and build its driver once, before any worker or store: a driver that
    cannot be built is refused naming ``--driver`` (exit 2, nothing written). Returns the policies' builder."""
    control = spec.control
    if control is None:
        return None
    try:
        check_segments(control, info.segment_names, info.name)
    except ControlError as exc:
        raise JobConfigError(control_message(exc)) from None
    if control.driver is None:
        return None
    timeout, watchdog = control.policy_timeout_s, spec.step_timeout_s
    if timeout is not None and watchdog is not None and timeout >= watchdog:
        raise JobConfigError(f"--policy-timeout {timeout:g} s must be below the step timeout ({watchdog:g} s, "
                             "--step-timeout), which would otherwise end the attempt first and blame the env")
    from demoforge.pipeline.policies import check_driver, policy_factory

    return check_driver(policy_factory(control.driver, info), control.driver)


def run_job(spec: JobSpec, store_dir: Path | str, on_progress: Callable[[JobStats], None] | None = None,
            handle_signals: bool = False, executor: ExecutorConfig | None = None) -> JobReport:
    prepare_process()  # the library's generate() comes in here, not through the CLI
    runner = JobRunner(spec, store_dir, on_progress, executor=executor)
    return anyio.run(lambda: runner.run(handle_signals=handle_signals))
