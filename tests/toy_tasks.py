"""Registers ``toy-point``: the PointEnv with a small camera, for fast pipeline tests of real processes
(import it through ``DEMOFORGE_TASK_MODULES=toy_tasks`` with ``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, TaskInfo, register
from demoforge.stages.contract import RecordedObservation
from toy_env import PointEnv, SegSpec


class CameraPointEnv(PointEnv):
    """A PointEnv whose camera shows a moving gradient (so video is real and frames differ)."""

    def __init__(self, options: dict[str, Any]) -> None:
        steps = int(options["steps"])
        super().__init__([SegSpec("approach", steps // 2), SegSpec("retreat", steps - steps // 2, delta=-1.0)])
        self.size = int(options["size"])
        self.step_sleep = float(options["step_sleep"])
        self.fail_every = int(options["fail_every"])
        self.options = options

    def step(self, action):
        if self.step_sleep:
            time.sleep(self.step_sleep)
        broken = os.environ.get("TOY_POINT_STEP_ERROR")  # tests: a task that fails every attempt
        if broken:
            raise RuntimeError(broken)
        return super().step(action)

    def demo_record(self, observation) -> RecordedObservation:
        s = self.size
        yy, xx = np.mgrid[0:s, 0:s]
        img = np.stack([(xx * 4 + self.t * 8) % 256, (yy * 4) % 256, np.full_like(xx, int(self.x * 10) % 256)],
                       axis=-1).astype(np.uint8)
        return RecordedObservation(state={"observation.state": observation}, images={"cam": img})

    def demo_success(self, observation, info) -> bool:
        # Deterministic failures: attempts whose seed is divisible by fail_every fail.
        seed = getattr(self, "_seed", 1)
        return not (self.fail_every and seed % self.fail_every == 0)

    def reset(self, *, seed=None, options=None):
        self._seed = seed
        return super().reset(seed=seed, options=options)


DEFAULTS = {"steps": 20, "size": 32, "step_sleep": 0.0, "fail_every": 0}


def describe(options) -> TaskInfo:
    steps = int(options["steps"])
    return TaskInfo(name="toy-point", description="a point on a line with a gradient camera",
                    instruction="walk forward, then back", fps=10, action_shape=(1,),
                    state_shapes={"observation.state": (2,)},
                    cameras=(CameraSpec("cam", options["size"], options["size"]),),
                    segment_names=("approach", "retreat") if steps > 1 else ("approach",), options=options)


register(TaskEntry(name="toy-point", defaults=DEFAULTS, describe=describe, make_env=lambda o: CameraPointEnv(dict(o))))


class NoisyPointEnv(CameraPointEnv):
    """Not reproducible: each step adds noise from a generator seeded by the OS, which no seed reaches (numpy's
    global generator was not enough: a library can seed it, and the same first draws in two processes made a
    replay diverge one frame late now and then)."""

    _entropy = np.random.default_rng()

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        self.x += float(self._entropy.normal(0.0, 0.01))
        return self._obs(), float(self.x), terminated, truncated, info


register(TaskEntry(name="toy-noisy", defaults=DEFAULTS, describe=lambda o: replace(describe(o), name="toy-noisy"),
                   make_env=lambda o: NoisyPointEnv(dict(o))))
