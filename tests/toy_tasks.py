"""Registers ``toy-point`` (the PointEnv with a small camera), ``toy-noisy`` and ``toy-cube`` (a plugin task
that can be multiplied), for fast pipeline tests of real processes (import it through
``DEMOFORGE_TASK_MODULES=toy_tasks`` with ``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, TaskInfo, register
from demoforge.stages.contract import RecordedObservation, Segment
from demoforge.stages.task_protocol import Pose
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


# -------------------------------------------------------------------------------------------- toy-cube
class ToyCubeEnv(gym.Env):
    """``toy-cube``: a plugin task with the multiply capability (TracksPoses), for tests of ``demoforge
    multiply`` on a task that is not built in. A point gripper moves by clipped Cartesian deltas (``STEP``
    metres per unit) above a table; one cube starts at a seeded place and yaw; closing the gripper within
    ``GRASP_RADIUS`` of the cube holds it (it follows the gripper). Success: the cube held ``LIFTED`` above the
    table. The planner reads the state as each segment runs (reach above the cube, descend, grasp, lift)."""

    metadata = {"render_modes": []}
    STEP, HOVER, LIFTED, GRASP_RADIUS = 0.02, 0.05, 0.08, 0.004
    CUBE_RANGE = 0.15

    def __init__(self, options: dict[str, Any]) -> None:
        self.max_steps = int(options["max_steps"])
        self.observation_space = gym.spaces.Box(-10.0, 10.0, shape=(8,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.eef: np.ndarray = np.zeros(3)
        self.cube: np.ndarray = np.zeros(3)
        self.yaw = 0.0
        self.held = False
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([*self.eef, *self.cube, self.yaw, float(self.held)], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.eef = np.array([0.0, 0.0, 0.12])
        self.cube = np.array([*rng.uniform(-self.CUBE_RANGE, self.CUBE_RANGE, 2), 0.0])
        self.yaw = float(rng.uniform(-0.6, 0.6))
        self.held, self.t = False, 0
        return self._obs(), {}

    def step(self, action):
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        self.eef = self.eef + self.STEP * np.clip(action[:3], -1.0, 1.0)
        self.eef[2] = max(self.eef[2], 0.0)
        closed = action[3] > 0
        if closed and not self.held and np.linalg.norm(self.eef - self.cube) < self.GRASP_RADIUS:
            self.held = True
        if not closed:
            self.held = False
            self.cube[2] = 0.0
        if self.held:
            self.cube = self.eef.copy()
        self.t += 1
        success = self.held and self.cube[2] >= self.LIFTED
        return self._obs(), float(success), success, self.t >= self.max_steps, {"success": success}

    # -- the task protocol
    def _toward(self, goal: Any, gripper: float) -> Iterator[np.ndarray]:
        """Clipped steps toward ``goal()`` (read at each step) until there, at most 100."""
        for _ in range(100):
            delta = goal() - self.eef
            if np.linalg.norm(delta) < 1e-9:
                return
            yield np.array([*np.clip(delta / self.STEP, -1.0, 1.0), gripper], dtype=np.float32)

    def create_demo_segments(self) -> Iterator[Segment]:
        yield Segment(actions=self._toward(lambda: self.cube + [0.0, 0.0, self.HOVER], -1.0), name="reach",
                      target="cube", instruction="move above the cube")
        yield Segment(actions=self._toward(lambda: self.cube, -1.0), name="descend", target="cube")
        yield Segment(actions=(np.array([0.0, 0.0, 0.0, 1.0], np.float32) for _ in range(2)), name="grasp",
                      target="cube")
        lift = self.eef + [0.0, 0.0, 0.1]
        yield Segment(actions=self._toward(lambda: lift, 1.0), name="lift", target="cube")

    def demo_record(self, observation) -> RecordedObservation:
        return RecordedObservation(state={"observation.state": observation}, images={})

    def demo_success(self, observation, info) -> bool:
        return bool(info.get("success", False))

    def demo_poses(self) -> ToyCubePoses:
        return ToyCubePoses(self)


class ToyCubePoses:
    """toy-cube's TaskPoses: a Cartesian-delta point gripper (identity orientation) and the yawed cube."""

    follows_plan = False

    def __init__(self, env: ToyCubeEnv) -> None:
        self.env = env

    def eef_pose(self) -> Pose:
        return Pose(self.env.eef)

    def object_poses(self) -> dict[str, Pose]:
        return {"cube": Pose(self.env.cube, np.array([np.cos(self.env.yaw / 2), 0.0, 0.0, np.sin(self.env.yaw / 2)]))}

    def reference(self, segment: str, target: str | None) -> str | None:
        return target

    def gripper(self, action: np.ndarray) -> float:
        return float(np.asarray(action).reshape(-1)[3])

    def commanded_pose(self, action: np.ndarray) -> Pose:
        return Pose(self.env.eef + self.env.STEP * np.clip(np.asarray(action, dtype=np.float64)[:3], -1.0, 1.0))

    def action_toward(self, pose: Pose, gripper: float) -> np.ndarray:
        move = np.clip((pose.position - self.env.eef) / self.env.STEP, -1.0, 1.0)
        return np.array([*move, np.clip(gripper, -1.0, 1.0)], dtype=np.float32)


register(TaskEntry(name="toy-cube", defaults={"max_steps": 200},
                   describe=lambda o: TaskInfo(name="toy-cube", description="a point gripper lifts a cube",
                                               instruction="lift the cube", fps=10, action_shape=(4,),
                                               state_shapes={"observation.state": (8,)}, cameras=(),
                                               segment_names=("reach", "descend", "grasp", "lift"), options=o),
                   make_env=lambda o: ToyCubeEnv(dict(o))))
