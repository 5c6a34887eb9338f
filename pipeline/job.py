"""A generation job: what to produce, how to encode it, and the fingerprint that binds it to a store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from demoforge.pipeline.flags import control_message  # the CLI's words for the stages' facts
from demoforge.pipeline.rerender_spec import RerenderSpec
from demoforge.pipeline.tasks.registry import TaskInfo, get_task
from demoforge.stages.control import ControlError, ControlSpec, check_control, control_features
from demoforge.stages.records import EpisodeLayout
# The job's settings that the stages read; a job is built with them (``JobSpec(..., video=VideoSettings())``).
from demoforge.stages.settings import (
    DEFAULT_MAX_CONSECUTIVE_ABANDONED,
    JobConfigError,
    VideoSettings,
)
from demoforge.storage.schema import SCHEMA_VERSION, Fingerprint

#: ``generate --encoder-priority`` / daemon ``job.encoder_priority`` -> JobSpec.encoder_idle.
ENCODER_PRIORITY_CHOICES: dict[str, bool | None] = {"auto": None, "normal": False, "idle": True}


@dataclass(frozen=True)
class JobSpec:
    """What ``demoforge generate`` runs. Only the fingerprint's fields are fixed for the life of a store.

    ``episodes`` is the target of committed episodes of each task: a suite job ends with ``episodes`` of every
    member (:meth:`target` in all)."""

    task: str
    episodes: int
    task_options: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    max_attempts: int = 3
    workers: int = 1
    num_envs: int = 1
    video: VideoSettings = field(default_factory=VideoSettings)
    chunk_frames: int = 64
    queue_frames: int = 32
    step_timeout_s: float | None = 60.0  # an env call that takes longer aborts the attempt (not in the fingerprint)
    # each worker's encoders run in a process of their own, not beside the env (stages/encoder_process.py);
    # None: when the frames are large enough (stages/settings.py encoders_apart). The bytes are the same either
    # way (not in the fingerprint)
    encoder_process: bool | None = None
    # that process's encoders run at idle priority (SCHED_IDLE), raised to normal while the worker waits for them
    # (stages/encoder_child.py); True turns the process on where encoder_process is None; None: idle wherever the
    # process runs; not in the fingerprint
    encoder_idle: bool | None = None
    # stop when this many episodes in a row were abandoned (0: never); not in the fingerprint
    max_consecutive_abandoned: int = DEFAULT_MAX_CONSECUTIVE_ABANDONED
    control: ControlSpec | None = None  # noise, a driving policy, beta, takeover (stages/control.py)
    # Re-simulate a recorded job's episodes (pipeline/rerender.py): ``episodes`` is sources x variants, each
    # index is run once, in order, and an episode that cannot be rerendered is reported, never replaced
    rerender: RerenderSpec | None = None
    # Commit failed attempts (contract.KEEPABLE_FAILURES) as episodes of their own besides the ``episodes``
    # successes (generate --keep-failures); fixed for the life of the store (in the fingerprint)
    keep_failures: bool = False

    def __post_init__(self) -> None:
        checks = {"episodes": (self.episodes, 0, 10_000_000), "max_attempts": (self.max_attempts, 1, 1000),
                  "workers": (self.workers, 1, 64), "num_envs": (self.num_envs, 1, 256),
                  "chunk_frames": (self.chunk_frames, 1, 100_000), "queue_frames": (self.queue_frames, 1, 100_000),
                  "seed": (self.seed, 0, 2**32 - 1),
                  "max_consecutive_abandoned": (self.max_consecutive_abandoned, 0, 10_000_000)}
        if self.step_timeout_s is not None and not (isinstance(self.step_timeout_s, (int, float))
                                                    and 0 < self.step_timeout_s <= 86400):
            raise JobConfigError(f"step_timeout_s must be in (0, 86400] seconds or None, got {self.step_timeout_s!r}")
        for name, (value, lo, hi) in checks.items():
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise JobConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.encoder_idle is True and self.encoder_process is False:
            raise JobConfigError("the idle encoder priority needs the encoder process (encoders beside the env run in "
                                 "the env's own process): set the encoder process on or auto, or the priority normal")

    def task_info(self) -> TaskInfo:
        return get_task(self.task).info(self.task_options)

    def check_control(self, info: TaskInfo) -> None:
        """Refuse a control that cannot apply to this task, before anything is written: bad values, and any
        control of a task whose expert cannot label states it did not choose (its labels would be wrong)."""
        if self.control is None:
            return
        try:
            check_control(self.control, tuple(info.action_shape))
        except ControlError as exc:
            raise JobConfigError(control_message(exc)) from None
        if not info.labels_any_state:
            what = "--driver" if self.control.driver else "--noise"
            raise JobConfigError(f"{what}: the expert of task {info.name!r} cannot label states it did not choose (it "
                                 "plans ahead instead of reacting to each observation), so its labels of noisy or "
                                 "policy-driven states would be wrong; `demoforge tasks NAME` says whether a "
                                 "task's expert labels any state (Meta-World's do)")

    def layout(self, info: TaskInfo) -> EpisodeLayout:
        """How the job's episode indices divide among its tasks (a suite's members), checked against ``episodes``."""
        layout = EpisodeLayout(max(1, len(info.suite)) if self.rerender is None else 1)
        if layout.groups > 1 and self.episodes > EpisodeLayout.STRIDE:
            raise JobConfigError(f"a suite job asks for at most {EpisodeLayout.STRIDE:,} episodes of each of its "
                                 f"tasks, got {self.episodes:,} ({info.name!r} has {layout.groups} tasks)")
        return layout

    def target(self, info: TaskInfo) -> int:
        """Committed episodes the job ends with: ``episodes`` of each task (a suite has several)."""
        return self.episodes * self.layout(info).groups

    def fingerprint(self, info: TaskInfo | None = None) -> Fingerprint:
        """Everything that shapes stored data: a store keeps one fingerprint for life."""
        info = info or self.task_info()
        depth = None
        if any(c.is_depth for c in info.cameras):
            from demoforge.storage.depth import lerobot_depth_identity

            depth = lerobot_depth_identity()
        return Fingerprint(schema_version=SCHEMA_VERSION, task=self.task, task_options=dict(info.options),
                           fps=info.fps, cameras=tuple(info.cameras),
                           state_shapes={**{k: tuple(v) for k, v in info.state_shapes.items()},
                                         **control_features(self.control, tuple(info.action_shape))},
                           action_shape=tuple(info.action_shape), video=self.video.identity(), seed=self.seed,
                           chunk_frames=self.chunk_frames, depth_video=depth,
                           control=self.control.to_json() if self.control is not None else None,
                           rerender=self.rerender.to_json() if self.rerender is not None else None,
                           keep_failures=self.keep_failures, feature_names=dict(info.feature_names),
                           # a task that names its robot's features records as that robot does (lerobot-record)
                           robot_type=info.robot_type if info.feature_names else None)
