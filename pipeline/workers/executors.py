"""One interface for whatever runs a job's env workers: threads of this process, worker processes, Ray actors.

The job's :class:`~demoforge.stages.recipe.WorkerRecipe` is derived here once (:func:`worker_recipe`) and every
executor runs it: :class:`ThreadExecutor` in env threads (stages/step.py), the remote executor
(pipeline/workers/driver.py) in workers it leases episodes to. The runner sees only :class:`JobExecutor`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from demoforge.pipeline.job import JobSpec
from demoforge.pipeline.rerender import build_job_env
from demoforge.pipeline.tasks.registry import TaskInfo, get_task
from demoforge.pipeline.workers.config import ExecutorConfig
from demoforge.pipeline.workers.driver import RemoteExecutor, WorkerCount
from demoforge.stages.context import StageContext
from demoforge.stages.control import Policy
from demoforge.stages.recipe import WorkerRecipe
from demoforge.stages.records import EpisodeAssignment, StagedAttempt
from demoforge.stages.settings import encoder_placement
from demoforge.stages.step import StepSettings, step_stage


class JobExecutor(Protocol):
    """Runs a job's env workers between the plan and the write stage."""

    def started(self) -> AbstractAsyncContextManager[Any]:
        """Its workers started (the body runs once one is ready, before the store is opened); leaving it closes
        them."""
        ...

    def start(self, tg: TaskGroup, assignments: MemoryObjectReceiveStream[EpisodeAssignment],
              send: MemoryObjectSendStream[Any], context: StageContext) -> None:
        """Start the stage in the job's task group: episodes in, their encoded records out, until the plan runs
        dry or ``context.stop`` is set."""
        ...

    def attempt_outcome(self, item: StagedAttempt) -> None:
        """The commit stage finished with an attempt (a remote executor re-runs a lost worker's attempt then)."""
        ...


def worker_recipe(spec: JobSpec, info: TaskInfo) -> WorkerRecipe:
    """What every env worker of the job runs, whatever the executor."""
    apart, idle = encoder_placement(spec.encoder_process, spec.encoder_idle, info.cameras)
    return WorkerRecipe(task=spec.task, job_seed=spec.seed, max_attempts=spec.max_attempts,
                        cameras=tuple(info.cameras), fps=info.fps, video=spec.video, encoder_process=apart,
                        encoder_idle=idle, control=spec.control, keep_failures=spec.keep_failures,
                        num_envs=spec.num_envs, step_timeout_s=spec.step_timeout_s)


class ThreadExecutor:
    """``workers`` env threads in this process, each stepping its own env (stages/step.py)."""

    def __init__(self, settings: StepSettings, make_env: Callable[[], Any], workers: int) -> None:
        self.settings, self.make_env, self.workers = settings, make_env, workers

    @asynccontextmanager
    async def started(self) -> AsyncIterator[ThreadExecutor]:
        yield self  # each thread builds its env when the stage runs (MuJoCo's context is bound to its thread)

    def start(self, tg: TaskGroup, assignments: MemoryObjectReceiveStream[EpisodeAssignment],
              send: MemoryObjectSendStream[Any], context: StageContext) -> None:
        with assignments, send:  # each thread holds its own clones
            for worker in range(self.workers):
                tg.start_soon(step_stage, worker, self.make_env, self.settings, assignments.clone(), send.clone(),
                              context)

    def attempt_outcome(self, item: StagedAttempt) -> None:
        pass


def open_executor(config: ExecutorConfig, spec: JobSpec, info: TaskInfo, *, store_dir: Path,
                  make_policy: Callable[[], Policy] | None,
                  on_event: Callable[[str], None] | None = None,
                  on_workers: Callable[[WorkerCount], None] | None = None) -> JobExecutor:
    """The executor ``config`` names, running the job's recipe. Env threads batch their records by a quarter of
    the job's queue and spill frame statistics into the store's folder; remote workers build their own driver."""
    recipe = worker_recipe(spec, info)
    if config.remote:
        return RemoteExecutor(config, recipe, spec, info, on_event, on_workers)
    settings = StepSettings(recipe, stats_dir=store_dir, send_batch=max(1, spec.queue_frames // 4),
                            make_policy=make_policy)
    make_env = functools.partial(build_job_env, get_task(spec.task), spec.task_options, spec.rerender)
    return ThreadExecutor(settings, make_env, spec.workers)
