"""What every env worker of a job runs, whatever runs it: a thread of this process, a worker process or a Ray
actor. The job derives it once (pipeline/workers/executors.py); each executor adds only what is its own (a
thread's send batches, a remote worker's piece size and task modules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym

from demoforge.stages.control import ControlSpec, Policy
from demoforge.stages.executor import Executor
from demoforge.stages.settings import VideoSettings
from demoforge.storage.schema import CameraSpec


@dataclass(frozen=True)
class WorkerRecipe:
    """A job's task and cameras, how its attempts are seeded, retried and driven, and how its frames are encoded
    (``video`` at ``fps``; ``encoder_process``: in a process of their own, ``encoder_idle``: that process at idle
    priority, stages/encoder_process.py). ``num_envs``: rows of one env worker; ``step_timeout_s``: how long env
    or task code may run before the attempt is aborted (None: no limit). Picklable: sent to remote workers."""

    task: str
    job_seed: int
    max_attempts: int
    cameras: tuple[CameraSpec, ...]
    fps: int
    video: VideoSettings = field(default_factory=VideoSettings)
    encoder_process: bool = False
    encoder_idle: bool = False
    control: ControlSpec | None = None  # who drives (stages/control.py)
    keep_failures: bool = False  # failed attempts end kept (stages/executor.py Executor)
    num_envs: int = 1
    step_timeout_s: float | None = None

    def executor(self, env: gym.Env | gym.vector.VectorEnv, *, worker: int,
                 make_policy: Callable[[], Policy] | None = None,
                 interrupt: Callable[[], bool] | None = None) -> Executor:
        """The episode executor of one worker's env, as the recipe says."""
        return Executor(env, task=self.task, job_seed=self.job_seed, max_attempts=self.max_attempts,
                        interrupt=interrupt, worker=worker, cameras=self.cameras, control=self.control,
                        keep_failures=self.keep_failures, make_policy=make_policy)
