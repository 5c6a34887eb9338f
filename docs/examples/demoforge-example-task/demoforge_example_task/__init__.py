"""An example demoforge task plugin: a point in the plane reaches a goal, then settles, seen from above and
from the side. Everything it touches comes from ``demoforge``'s public API."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge import CameraSpec, RecordedObservation, Segment, TaskEntry, TaskInfo, TaskOptionError


class SliderReach(gym.Env):
    """Position and goal in [0, 1]^2; an action moves the point by at most 0.1 per axis."""

    metadata = {"render_modes": []}

    def __init__(self, size: int, tolerance: float) -> None:
        self.size, self.tolerance = size, tolerance
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-0.1, 0.1, shape=(2,), dtype=np.float32)
        self.pos = np.zeros(2)
        self.goal = np.zeros(2)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.goal]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos, self.goal = self.np_random.uniform(0.1, 0.9, size=(2, 2))  # the seed fixes the scene
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + np.clip(action, -0.1, 0.1), 0.0, 1.0)
        near = float(np.linalg.norm(self.pos - self.goal)) < self.tolerance
        return self._obs(), float(near), False, False, {"success": near}

    # -- the demonstration protocol
    def create_demo_segments(self) -> Iterator[Segment]:
        # Planned from the state the reset left; the second segment from where the first one ended.
        yield Segment(actions=self._towards(0.1, until=0.1), name="approach", target="goal",
                      validator=lambda view: float(np.linalg.norm(self.pos - self.goal)) < 0.1)
        yield Segment(actions=self._towards(0.02, until=self.tolerance / 2), name="settle", target="goal",
                      metadata={"start_error": float(np.linalg.norm(self.pos - self.goal))})

    def _towards(self, step: float, until: float) -> Iterator[np.ndarray]:
        """Closed loop: each action is computed after the previous one was stepped. At least one action."""
        for i in range(60):
            delta = self.goal - self.pos
            if i and np.linalg.norm(delta) < until:
                return
            yield np.clip(delta, -step, step).astype(np.float32)

    def demo_success(self, observation: np.ndarray, info: Mapping[str, Any]) -> bool:
        return bool(np.linalg.norm(self.pos - self.goal) < self.tolerance)

    def demo_record(self, observation: np.ndarray) -> RecordedObservation:
        return RecordedObservation(state={"observation.state": observation},
                                   images={"overhead": self._overhead(), "side": self._side()})

    def demo_instruction(self) -> str:
        return "move the point onto the goal"

    def _overhead(self) -> np.ndarray:
        s = self.size
        img = np.full((s, s, 3), 40, np.uint8)
        for (x, y), colour in ((self.goal, (0, 200, 0)), (self.pos, (230, 60, 30))):
            cx, cy = int(x * (s - 1)), int(y * (s - 1))
            img[max(cy - 2, 0):cy + 3, max(cx - 2, 0):cx + 3] = colour
        return img

    def _side(self) -> np.ndarray:
        s = self.size
        img = np.full((s // 2, s, 3), 90, np.uint8)  # a different size: cameras are independent streams
        img[:, int(self.goal[0] * (s - 1))] = (0, 200, 0)
        img[:, int(self.pos[0] * (s - 1))] = (230, 60, 30)
        return img


def describe(options: Mapping[str, Any]) -> TaskInfo:
    size = int(options["size"])
    return TaskInfo(name="slider-reach", description="a point reaches a goal, then settles (two cameras)",
                    instruction="move the point onto the goal", fps=20, action_shape=(2,),
                    state_shapes={"observation.state": (4,)},
                    cameras=(CameraSpec("overhead", size, size), CameraSpec("side", size // 2, size)),
                    segment_names=("approach", "settle"), options=dict(options))


def check(options: Mapping[str, Any]) -> None:
    if options["size"] < 16 or options["size"] % 4:
        raise TaskOptionError(f"size must be a multiple of 4 and at least 16, got {options['size']}")


def task() -> TaskEntry:
    """The entry point's factory: demoforge registers the entry under the entry point's name."""
    return TaskEntry(name="slider-reach", defaults={"size": 64, "tolerance": 0.02}, describe=describe,
                     make_env=lambda o: SliderReach(int(o["size"]), float(o["tolerance"])), check=check)
