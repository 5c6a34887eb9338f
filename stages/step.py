"""Step stage: env workers in threads, each running the executor and its own encoders, and pushing encoded
records downstream.

Each worker thread steps its env and hands every frame to its camera lanes (stages/record_encoder.py), as a
remote worker does: one route for a frame whatever the executor. A worker blocks on the bounded stream when
later stages are slower (backpressure reaches the env), and waits for its encoders when it is ``encode_lag``
jobs ahead of them. MuJoCo's EGL context is bound to the thread that created it, so each worker builds,
steps and closes its own env in its own thread.

A watchdog guards against an env that hangs (a step, reset or build that never returns): when a worker has
been inside env or task code for longer than ``step_timeout_s``, its in-flight attempts end as errors
(``StepTimeoutError``, discarded and counted), their episodes move to a fresh worker with a fresh env, and
the hung thread is abandoned: Python cannot kill a thread, so it is left blocked and whatever it does if it
ever returns is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import gymnasium as gym
from anyio.lowlevel import EventLoopToken
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.stages.attempts import AttemptLedger, RetryPolicy
from demoforge.stages.contract import EnvError
from demoforge.stages.context import StageContext
from demoforge.stages.control import Policy
from demoforge.stages.recipe import WorkerRecipe
from demoforge.stages.record_encoder import DEFAULT_ENCODE_LAG, RecordEncoder
from demoforge.stages.records import (
    PENDING,
    EncodedRecord,
    EpisodeAssignment,
    Pending,
)


class StepTimeoutError(EnvError):
    """The env did not return within the step timeout; the attempt was aborted."""


def build_env(make_row_env: Callable[[], gym.Env], num_envs: int) -> gym.Env | gym.vector.VectorEnv:
    if num_envs == 1:
        return make_row_env()
    return gym.vector.SyncVectorEnv([make_row_env] * num_envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED)


class _Abandoned(Exception):
    """Raised inside an abandoned worker thread to unwind it without sending anything."""


@dataclass
class _Worker:
    """What the watchdog knows of one worker thread."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    busy_since: float | None = None  # set while inside env/task code, None while waiting on a stream
    abandoned: bool = False
    error: BaseException | None = None
    ledger: AttemptLedger = field(default_factory=AttemptLedger)  # the attempts in flight
    pending: list[EncodedRecord] = field(default_factory=list)  # encoded, not yet sent (a batch being filled)

    def idle(self) -> None:
        """Leave env code; unwinds the thread if the watchdog gave up on it meanwhile."""
        with self.lock:
            self.busy_since = None
            if self.abandoned:
                raise _Abandoned

    def busy(self) -> None:
        self.busy_since = time.monotonic()



class _StreamWork:
    """The executor's work source: episodes taken over from a hung worker first, then the plan stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[EpisodeAssignment], stop: threading.Event,
                 worker: _Worker, token: EventLoopToken, carry: list[EpisodeAssignment],
                 before_wait: Callable[[], None] = lambda: None) -> None:
        self.receive = receive
        self.stop = stop
        self.worker = worker
        self.token = token
        self.carry = carry
        self.before_wait = before_wait

    def next_episode(self, wait: bool = True) -> EpisodeAssignment | None | Pending:
        if self.carry:
            return self.carry.pop(0)
        if self.stop.is_set():
            return None
        self.worker.idle()
        try:
            if wait:
                # Work that is there already is taken at once: the encoders finish the last attempt's frames
                # while the env resets and plans (draining them here stalled the env 0.3-0.4 s an episode).
                try:
                    return anyio.from_thread.run_sync(self.receive.receive_nowait, token=self.token)
                except anyio.WouldBlock:
                    pass
                self.before_wait()  # records produced so far go downstream before this worker blocks
                return anyio.from_thread.run(self.receive.receive, token=self.token)
            return anyio.from_thread.run_sync(self.receive.receive_nowait, token=self.token)
        except anyio.WouldBlock:
            return PENDING
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None
        finally:
            self.worker.busy()


@dataclass(frozen=True)
class StepSettings:
    """How a job's env threads run its :class:`~demoforge.stages.recipe.WorkerRecipe` in this process: frame
    statistics spill into ``stats_dir`` (None: the system's temporary folder); ``encode_lag``: encoder jobs the env
    may run ahead of its encoders; ``make_policy`` builds a driving policy (the job builds its driver once).

    ``send_batch``/``send_wait_s``: records go downstream in batches of up to ``send_batch``, one hand-off to
    the event loop per batch; a record waits at most ``send_wait_s`` (or the next step, whichever is later)
    for its batch to fill, and a worker sends what it has (its encoders drained) before it waits for work;
    when the next episode is there already it goes on at once. An env then costs one hand-off per batch
    instead of one per record (each a round trip through the event loop that wakes its thread: 1.5-2.5 ms on
    a busy 2-core machine, half a second of an 800-step run); the env runs at most ``send_batch - 1`` records
    ahead of a full stream. The watchdog's limit is the recipe's ``step_timeout_s`` (None: no watchdog)."""

    recipe: WorkerRecipe
    stats_dir: Path | None = None
    encode_lag: int = DEFAULT_ENCODE_LAG
    send_batch: int = 1
    send_wait_s: float = 0.25
    make_policy: Callable[[], Policy] | None = None


async def step_stage(worker: int, make_row_env: Callable[[], gym.Env], settings: StepSettings,
                     assignments: MemoryObjectReceiveStream[EpisodeAssignment],
                     send: MemoryObjectSendStream[EncodedRecord], context: StageContext | None = None) -> None:
    """Run one env worker until the plan runs dry or ``context.stop`` is set; in-flight attempts end interrupted.

    A worker whose env hangs past the step timeout is given up (its attempts end as errors) and a fresh one
    takes over its episodes. ``context.busy["step:<worker>"]`` accumulates the time spent producing records
    (not waiting downstream), ``context.busy["encode:<worker>:<camera>"]`` its encoders' time."""
    context = context or StageContext()
    carry: list[EpisodeAssignment] = []
    async with send, assignments:
        while True:
            thread = _EnvThread(worker, make_row_env, settings, assignments, send, context, carry)
            if not await thread.run():
                return
            carry = await thread.give_up()


class _EnvThread:
    """One env worker thread and its watchdog: builds, steps and closes its own env (MuJoCo's EGL context is
    bound to the thread that made it), encodes its frames and pushes the records into the stream in batches."""

    def __init__(self, worker: int, make_row_env: Callable[[], gym.Env], settings: StepSettings,
                 assignments: MemoryObjectReceiveStream[EpisodeAssignment],
                 send: MemoryObjectSendStream[EncodedRecord], context: StageContext,
                 carried: list[EpisodeAssignment]) -> None:
        self.worker, self.make_row_env, self.settings = worker, make_row_env, settings
        self.assignments, self.send, self.context = assignments, send, context
        self.carried = carried  # episodes taken over from a hung predecessor, run first
        self.state = _Worker()
        self.token = anyio.lowlevel.current_token()
        self.done = anyio.Event()  # set from the thread when it ends (not when it is given up)
        self.busy_key = f"step:{worker}"
        self.encoder: RecordEncoder | None = None  # made by the thread; the watchdog drains it after a hang

    async def run(self) -> bool:
        """Run the thread to its end; True when it hung and was given up instead."""
        thread = threading.Thread(target=self._work, name=f"env-worker-{self.worker}", daemon=True)
        thread.start()
        if await self._watch():
            return True
        await anyio.to_thread.run_sync(thread.join)
        if isinstance(self.state.error, anyio.BrokenResourceError):
            return False  # the next stage is gone: it failed or was cancelled, and reports why itself
        if self.state.error is not None:
            raise self.state.error
        return False

    async def _watch(self) -> bool:
        """Wait for the thread; give it up once it has been inside env or task code past the timeout."""
        timeout = self.settings.recipe.step_timeout_s
        state = self.state
        while not self.done.is_set():
            if timeout is None:
                await self.done.wait()
                break
            since = state.busy_since
            left = timeout if since is None else since + timeout - time.monotonic()
            with anyio.move_on_after(max(left, 0.001)):
                await self.done.wait()
            with state.lock:
                since = state.busy_since
                if not self.done.is_set() and since is not None and time.monotonic() - since >= timeout:
                    state.abandoned = True
                    return True
        return False

    async def _send_all(self, records: list[EncodedRecord]) -> None:
        # What fits in the stream goes in at once: ``send`` yields to the event loop before each record, and
        # this env thread waits for the whole batch, so every yield would let other stages run on its time.
        # Only a full stream (backpressure) makes it wait.
        for record in records:
            try:
                self.send.send_nowait(record)
            except anyio.WouldBlock:
                await self.send.send(record)

    def _send_batch(self) -> None:
        state = self.state
        if state.pending:
            batch = list(state.pending)
            anyio.from_thread.run(self._send_all, batch, token=self.token)
            del state.pending[:len(batch)]
        if self.encoder is not None:
            for camera, seconds in self.encoder.busy_seconds().items():
                self.context.busy.set(f"encode:{self.worker}:{camera}", seconds)

    def _flush(self) -> None:
        """Everything this worker made goes downstream (its encoders finish what they hold first)."""
        if self.encoder is not None:
            self.state.pending.extend(self.encoder.drain())
        self._send_batch()

    def _work(self) -> None:
        state, settings, context = self.state, self.settings, self.context
        recipe = settings.recipe
        stop, delay_s = context.stop, context.delay("step")
        send_batch = max(1, settings.send_batch)
        env = None
        first_at = 0.0
        try:
            self.encoder = encoder = RecordEncoder(recipe.cameras, recipe.fps, recipe.video,
                                                   stats_dir=settings.stats_dir, lag=settings.encode_lag,
                                                   context=context,
                                                   apart=recipe.encoder_process, idle=recipe.encoder_idle)
            state.busy()
            env = build_env(self.make_row_env, recipe.num_envs)
            executor = recipe.executor(env, worker=self.worker, make_policy=settings.make_policy,
                                       interrupt=lambda: stop.is_set() or state.abandoned)
            work = _StreamWork(self.assignments, stop, state, self.token, self.carried, before_wait=self._flush)
            for record in executor.run(work):
                started = state.busy_since
                state.idle()
                now = time.monotonic()
                if started is not None:
                    context.busy.add(self.busy_key, now - started)
                state.ledger.track(record)
                before = len(state.pending)
                state.pending.extend(encoder.feed(record))
                if before == 0 and state.pending:
                    first_at = now
                if state.pending and (len(state.pending) >= send_batch or now - first_at >= settings.send_wait_s
                                      or delay_s):
                    self._send_batch()
                if delay_s:
                    stop.wait(delay_s)
                state.busy()
            state.idle()
            self._flush()
        except _Abandoned:
            return
        except BaseException as exc:  # reported to the event loop, which re-raises it there
            state.error = exc
        finally:
            state.busy_since = None
            if env is not None and not state.abandoned:
                env.close()
            if self.encoder is not None and not state.abandoned:
                self.encoder.close()
            if not state.abandoned:
                try:
                    anyio.from_thread.run_sync(self.done.set, token=self.token)
                except RuntimeError:
                    pass  # the event loop is gone (the job was cancelled): nobody waits for this thread

    async def give_up(self) -> list[EpisodeAssignment]:
        """The env hung: end its attempts as errors and return their episodes for a fresh worker, with the
        episodes it had taken over and not started yet."""
        state, recipe, send, encoder = self.state, self.settings.recipe, self.send, self.encoder
        carry = list(self.carried)
        # Records the hung worker produced but had not sent yet go first, once its encoders have finished them
        # (it can no longer touch them: an abandoned worker stops at its next idle(), before its batch or its
        # encoders). Its failed attempts' ends then go through the same encoders, which drop their video.
        error = StepTimeoutError(f"the env did not return within {recipe.step_timeout_s:g} s; attempt aborted "
                                 "and the worker replaced", task=recipe.task)
        ends = list(state.ledger.end_all_failed(recipe.task, error, RetryPolicy(recipe.max_attempts)))

        def finish() -> list[EncodedRecord]:
            if encoder is None:
                return [ended for ended, _ in ends]
            try:
                out = encoder.drain()
                for ended, _ in ends:
                    out.extend(encoder.feed(ended))
                return out + encoder.drain()
            finally:
                encoder.close()

        records = [*state.pending, *await anyio.to_thread.run_sync(finish)]
        state.pending.clear()
        for record in records:
            await send.send(record)
        for _, then in ends:
            if isinstance(then, EpisodeAssignment):
                carry.append(then)
            else:
                await send.send(then)
        return carry
