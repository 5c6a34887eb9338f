"""Step stage: env workers in threads, each running the executor and pushing its records downstream.

A worker blocks on the bounded record stream when later stages are slower (backpressure reaches the env).
MuJoCo's EGL context is bound to the thread that created it, so each worker builds, steps and closes its
own env in its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
import anyio.from_thread
import gymnasium as gym
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.pipeline.executor import PENDING, EpisodeAssignment, Executor, _Pending
from demoforge.pipeline.records import Record


def build_env(make_row_env: Callable[[], gym.Env], num_envs: int) -> gym.Env | gym.vector.VectorEnv:
    if num_envs == 1:
        return make_row_env()
    return gym.vector.SyncVectorEnv([make_row_env] * num_envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED)


class _StreamWork:
    """The executor's work source, fed from the plan stage's stream across the thread boundary."""

    def __init__(self, receive: MemoryObjectReceiveStream[EpisodeAssignment], stop: threading.Event) -> None:
        self.receive = receive
        self.stop = stop

    def next_episode(self, wait: bool = True) -> EpisodeAssignment | None | _Pending:
        if self.stop.is_set():
            return None
        try:
            if wait:
                return anyio.from_thread.run(self.receive.receive)
            return anyio.from_thread.run_sync(self.receive.receive_nowait)
        except anyio.WouldBlock:
            return PENDING
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None


async def step_stage(worker: int, make_row_env: Callable[[], gym.Env], *, task: str, num_envs: int,
                     job_seed: int, max_attempts: int, assignments: MemoryObjectReceiveStream[EpisodeAssignment],
                     send: MemoryObjectSendStream[Record], stop: threading.Event, delay_s: float = 0.0,
                     busy: dict[str, float] | None = None) -> None:
    """Run one env worker until the plan runs dry or ``stop`` is set; in-flight attempts end interrupted.

    ``busy["step:<worker>"]`` accumulates the time spent producing records (not waiting downstream)."""

    def work() -> None:
        env = build_env(make_row_env, num_envs)
        try:
            executor = Executor(env, task=task, job_seed=job_seed, max_attempts=max_attempts,
                                interrupt=stop.is_set, worker=worker)
            mark = time.perf_counter()
            for record in executor.run(_StreamWork(assignments, stop)):
                if busy is not None:
                    busy[f"step:{worker}"] = busy.get(f"step:{worker}", 0.0) + time.perf_counter() - mark
                anyio.from_thread.run(send.send, record)
                if delay_s:
                    stop.wait(delay_s)
                mark = time.perf_counter()
        finally:
            env.close()

    async with send, assignments:
        await anyio.to_thread.run_sync(work)
