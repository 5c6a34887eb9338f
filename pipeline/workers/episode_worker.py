"""The worker side of a scale-out executor: one env, the executor, and the worker's own encoders
(stages/record_encoder.py, as every env thread of a local job runs them).

A worker runs one leased episode at a time (all its attempts, as the executor retries them) and returns it
as a stream of bounded :class:`Piece` s: at most ``batch_frames`` encoded frames each, cut at every attempt's
end. The records inside are the ones the write stage already consumes (``AttemptStarted``, ``EncodedFrame``,
``VideoTail``, ``AttemptEnded``, ``EpisodeAbandoned``), so the driver feeds them in unchanged.

Encoded bytes equal a thread run's: every attempt gets new encoders with the job's settings, and an encoder's
output depends only on its settings and the frames it is fed.
"""

from __future__ import annotations

import importlib
import os
import socket
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from demoforge.pipeline.environment import WORKER_ENVIRONMENT
from demoforge.pipeline.rerender_spec import RerenderSpec
from demoforge.pipeline.workers.config import WorkerStartError
from demoforge.stages.attempts import AttemptLedger, RetryPolicy
from demoforge.stages.recipe import WorkerRecipe
from demoforge.stages.record_encoder import RecordEncoder
from demoforge.stages.records import (
    AttemptEnded,
    AttemptKey,
    AttemptStarted,
    EncodedFrame,
    EncodedRecord,
    EpisodeAbandoned,
    EpisodeAssignment,
    VideoTail,
)

MAX_PIECE_BYTES = 8 << 20  # a piece is also cut when its encoded bytes reach this...
MAX_PIECE_SECONDS = 0.5  # ...or when it has been filling this long: a slow env still reports progress, so the
#                          driver can tell a hung worker (no piece within the step timeout) from a slow one


@dataclass(frozen=True)
class Piece:
    """A bounded slice of one lease's output; ``lease_done`` marks the lease's last piece."""

    records: tuple[EncodedRecord, ...]
    frames: int = 0
    lease_done: bool = False


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a remote worker needs to produce a job's episodes (picklable, sent once at start): the job's
    :class:`WorkerRecipe`, how to build its env here (the task's options, a rerender's source), and what is a
    remote worker's own (its slot, the piece size, the modules and environment it needs before the task)."""

    recipe: WorkerRecipe
    task_options: Mapping[str, Any]
    batch_frames: int
    worker: int = 0
    task_modules: tuple[str, ...] = ()  # imported before the task is looked up (plugins register tasks)
    # set in every worker before any simulator is imported (a Ray worker does not inherit the driver's shell)
    environment: Mapping[str, str] = field(default_factory=lambda: dict(WORKER_ENVIRONMENT))
    rerender: RerenderSpec | None = None  # a rerender job's source (pipeline/rerender.py)

    @property
    def task(self) -> str:
        return self.recipe.task


def task_modules_for(task_entry: Any) -> tuple[str, ...]:
    """Modules a worker must import to know the task: ``DEMOFORGE_TASK_MODULES`` plus the module that
    defined the task's env factory (a task registered by a test or an embedding program)."""
    names = [m.strip() for m in os.environ.get("DEMOFORGE_TASK_MODULES", "").split(",") if m.strip()]
    module = getattr(task_entry.make_env, "__module__", None)
    if module and module != "__main__" and not module.startswith("demoforge.") and module not in names:
        names.append(module)
    return tuple(names)


def where() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class EpisodeWorker:
    """Builds the task's env once and runs leases on it; see the module docstring."""

    def __init__(self, spec: WorkerSpec) -> None:
        for key, value in spec.environment.items():
            os.environ.setdefault(key, value)
        self.spec = spec
        from demoforge.pipeline.tasks.registry import UnknownTaskError, get_task

        failures = []
        for module in spec.task_modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any import-time failure of a plugin: report it with the task's name
                failures.append(f"importing module {module!r} failed: {type(exc).__name__}: {exc}")
        try:
            self.entry = get_task(spec.task)
        except UnknownTaskError:
            detail = "; ".join(failures) or "no installed module registers it"
            raise WorkerStartError(
                f"worker {spec.worker} ({where()}) cannot import task {spec.task!r}: {detail}. Install the project "
                "and the task's plugin on every worker machine (and list plugin modules in "
                "DEMOFORGE_TASK_MODULES).") from None
        self.env: Any = None
        try:
            self.env = self._build()
        except Exception as exc:
            raise WorkerStartError(f"worker {spec.worker} ({where()}) cannot build task {spec.task!r}: "
                                   f"{type(exc).__name__}: {exc}") from None
        recipe = spec.recipe
        self._policy: Any = None
        if recipe.control is not None and recipe.control.driver is not None:
            from demoforge.pipeline.policies import policy_factory

            try:
                self._policy = policy_factory(recipe.control.driver, self.entry.info(spec.task_options))()
            except Exception as exc:
                raise WorkerStartError(f"worker {spec.worker} ({where()}) cannot load --driver "
                                       f"{recipe.control.driver}: {type(exc).__name__}: {exc}") from None
        # The worker's encoders, as an env thread of a local job runs them: one lane per camera, each owning an
        # attempt's encoder from its first frame to its finish or abort.
        self._encoder = RecordEncoder(recipe.cameras, recipe.fps, recipe.video, apart=recipe.encoder_process,
                                      idle=recipe.encoder_idle)

    def _build(self) -> Any:
        from demoforge.pipeline.rerender import build_job_env

        return build_job_env(self.entry, self.spec.task_options, self.spec.rerender)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
        self._encoder.close()

    # ------------------------------------------------------------------------------------ one lease
    def run_lease(self, episode_index: int, first_attempt: int) -> Iterator[Piece]:
        """All attempts of one episode, as pieces; never raises for the episode's own failures.

        Frames are encoded in one thread per camera while the env computes the next step (PyAV and MuJoCo
        release the GIL), a few frames behind (stages/record_encoder.py); pieces carry records in order."""
        spec, recipe = self.spec, self.spec.recipe
        out = _PieceBuilder(spec.batch_frames)
        attempt = first_attempt
        while True:
            ledger = AttemptLedger()  # the attempt in progress
            try:
                executor = recipe.executor(self.env, worker=spec.worker,
                                           make_policy=(lambda: self._policy) if self._policy is not None else None)
                for record in executor.run(_OneEpisode(EpisodeAssignment(episode_index, attempt))):
                    ledger.track(record)
                    out.add(*self._encoder.feed(record))
                    if isinstance(record, AttemptEnded):
                        out.add(*self._encoder.drain())  # the attempt's last frames, its tail and its end
                    if isinstance(record, (AttemptStarted, AttemptEnded)) or out.full():
                        yield out.cut()  # at once when an attempt starts or ends: the driver knows what runs
                break
            except Exception as exc:  # the env, the task or an encoder raised outside the executor's handling
                self._encoder.reset()  # drops the frames still encoding; fresh lanes abort the old encoders
                if not ledger:
                    raise  # not inside an attempt: a worker fault (the driver re-runs the lease elsewhere)
                (active,) = ledger.in_flight()
                key = active.key
                # The frames that reach the driver: those sent, and those in the batch (pending ones were dropped).
                active.frames = out.sent_frames.get(key, 0) + sum(1 for r in out.batch if isinstance(r, EncodedFrame)
                                                                  and r.key == key)
                result = active.failed(recipe.task, f"worker ({where()}) raised {type(exc).__name__}: {exc}",
                                       type(exc).__name__)
                out.add(active.ended(result))
                yield out.cut()
                self._rebuild()
                then = RetryPolicy(recipe.max_attempts).after(key, result)
                if isinstance(then, EpisodeAbandoned):
                    out.add(then)
                    break
                attempt = then.first_attempt
        yield out.cut(lease_done=True)

    def _rebuild(self) -> None:
        """After an unexpected exception the env's state is unknown: start the next attempt on a new one."""
        try:
            self.env.close()
        except Exception:
            pass
        self.env = self._build()


class _PieceBuilder:
    """The piece being filled: encoded records in order, with its frame count and encoded bytes."""

    def __init__(self, batch_frames: int) -> None:
        self.batch_frames = batch_frames
        self.batch: list[EncodedRecord] = []
        self.frames = 0
        self.size = 0
        self.started = time.monotonic()
        self.sent_frames: dict[AttemptKey, int] = {}

    def add(self, *records: EncodedRecord) -> None:
        for record in records:
            self.batch.append(record)
            if isinstance(record, EncodedFrame):
                self.frames += 1
                self.size += sum(len(v) for v in record.video.values())
            elif isinstance(record, VideoTail):
                self.size += sum(len(v) for v in record.video.values())

    def full(self) -> bool:
        return self.frames >= self.batch_frames or self.size >= MAX_PIECE_BYTES or \
            time.monotonic() - self.started >= MAX_PIECE_SECONDS

    def cut(self, lease_done: bool = False) -> Piece:
        piece = Piece(tuple(self.batch), self.frames, lease_done)
        for record in self.batch:
            if isinstance(record, EncodedFrame):
                self.sent_frames[record.key] = self.sent_frames.get(record.key, 0) + 1
        self.batch, self.frames, self.size, self.started = [], 0, 0, time.monotonic()
        return piece


class _OneEpisode:
    """A work source holding one assignment."""

    def __init__(self, assignment: EpisodeAssignment) -> None:
        self._assignment: EpisodeAssignment | None = assignment

    def next_episode(self, wait: bool = True) -> EpisodeAssignment | None:
        assignment, self._assignment = self._assignment, None
        return assignment


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()

