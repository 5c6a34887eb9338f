"""A tiny deterministic env for contract tests: a point on a line that moves by each action.

Its planner is a generator over a list of segment specs; each segment walks toward a target computed from
the position the previous segment left (lazy planning), and the specs can inject failures.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.stages.contract import RecordedObservation, Segment, Validator


@dataclass(frozen=True)
class SegSpec:
    """One planned segment: ``steps`` actions of size ``delta``; ``valid`` is the validator's verdict."""

    name: str
    steps: int
    delta: float = 1.0
    valid: bool = True


class PointEnv(gym.Env):
    """Position x starts at the seed's value mod 7; each step adds the action; truncates at max_steps."""

    metadata = {"render_modes": []}

    def __init__(self, plan: Sequence[SegSpec] = (), max_steps: int = 1000, success: bool | None = True,
                 terminate_at: int | None = None, raise_at: int | None = None, image: bool = False) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-10, 10, shape=(1,), dtype=np.float32)
        self.plan = list(plan)
        self.max_steps = max_steps
        self.success_value = success
        self.terminate_at = terminate_at
        self.raise_at = raise_at
        self.image = image
        self.x = 0.0
        self.t = 0
        self.resets = 0
        self.positions_seen_by_planner: list[float] = []
        self.actions_log: list[float] = []

    def _obs(self) -> np.ndarray:
        return np.array([self.x, self.t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.x = float(seed % 7) if seed is not None else 0.0
        self.t = 0
        self.resets += 1
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.raise_at is not None and self.t == self.raise_at:
            raise RuntimeError("simulated physics blow-up")
        self.actions_log.append(float(np.asarray(action).reshape(-1)[0]))
        self.x += self.actions_log[-1]
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        truncated = self.t >= self.max_steps
        info: dict[str, Any] = {}
        if self.success_value is not None:
            info["success"] = self.success_value
        return self._obs(), float(self.x), terminated, truncated, info

    # -- the task protocol
    def create_demo_segments(self) -> Iterator[Segment]:
        for spec in self.plan:
            start = self.x  # read lazily: the state the previous segment left
            self.positions_seen_by_planner.append(start)
            yield Segment(actions=(np.array([spec.delta], np.float32) for _ in range(spec.steps)),
                          name=spec.name, metadata={"start_x": start},
                          validator=_always(spec.valid))

    def demo_record(self, observation) -> RecordedObservation:
        images = {}
        if self.image:
            images["cam"] = np.full((8, 8, 3), int(self.x) % 256, dtype=np.uint8)
        return RecordedObservation(state={"observation.state": observation}, images=images)


class HoldingPointEnv(PointEnv):
    """A PointEnv whose task defines a hold action (a recognisable value, so tests can see it used)."""

    hold_calls = 0

    def demo_hold_action(self) -> np.ndarray:
        self.hold_calls += 1
        return np.zeros(1, np.float32)


def _always(verdict: bool) -> Validator:
    """A validator that says ``verdict`` whatever the segment left."""
    return lambda view: verdict
