"""Who drives an attempt: the expert alone, the expert with injected noise, or a policy that the expert labels.

Every frame's ``action`` stays the expert's label for the state the frame observed (what a policy trains on);
what was stepped goes beside it as its own feature (:data:`EXECUTED_ACTION`), and whether the expert had taken
control by a takeover rule as :data:`INTERVENTION` (LeRobot's name for the same flag in its DAgger rollouts).
The executor asks an :class:`AttemptControl` once per step; all randomness comes from the attempt's seed, so a
thread, process or Ray worker makes the same episode for the same seed.

- noise (DART; ACT's scripted ALOHA data): executed = clip(expert + N(0, scale)), optionally only in named
  segments;
- a policy drives, the expert's action is executed instead with probability ``beta`` at each step (DAgger's
  mixture);
- takeover (HG-DAgger): when the policy's action differs from the expert's by more than ``gap`` (largest
  absolute difference over the action's dimensions) for ``steps`` steps in a row, the expert drives until its
  phase (the segment) advances past the one where it took over.
Only a task whose expert can label states it did not choose (a reactive expert) may be driven this way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from demoforge.stages.actions import check_action
from demoforge.stages.contract import POLICY_DRIVER, RecordedObservation, TaskError

EXECUTED_ACTION = "executed_action"  # the action the env was stepped with, per frame
INTERVENTION = "intervention"  # 1 where the expert drove because a takeover rule fired, else 0
NOISE_SALT, POLICY_SALT = 0x4E015E, 0xBE7A  # separate generators for noise and for the beta draw


class ControlError(ValueError):
    """A control option (noise, driver, beta, takeover) is malformed; the message names it."""


@dataclass(frozen=True)
class NoiseSpec:
    """Gaussian noise added to the executed action: one scale for every dimension, or one per dimension;
    ``segments``: only in these segments (empty: everywhere)."""

    scales: tuple[float, ...]
    segments: tuple[str, ...] = ()

    def text(self) -> str:
        where = f"@{'+'.join(self.segments)}" if self.segments else ""
        return f"gaussian:{','.join(f'{s:g}' for s in self.scales)}{where}"


@dataclass(frozen=True)
class TakeoverRule:
    """The expert takes over after ``steps`` steps in a row where the driver's action differs from its own by
    more than ``gap``, and hands back once its phase has advanced."""

    gap: float
    steps: int

    def text(self) -> str:
        return f"gap:{self.gap:g}:{self.steps}"


@dataclass(frozen=True)
class ControlSpec:
    """How a job's attempts are driven (picklable; sent to every worker). ``driver``: the policy's reference
    (``module:factory`` or a LeRobot checkpoint folder), None for the expert."""

    noise: NoiseSpec | None = None
    driver: str | None = None
    beta: float = 0.0
    takeover: TakeoverRule | None = None

    def describe(self) -> str:
        """Who drove, as the episode record and ``--keep-where`` name it: ``expert``, ``expert+noise`` or
        ``policy``."""
        if self.driver is None:
            noisy = self.noise is not None and any(self.noise.scales)
            return "expert+noise" if noisy else "expert"
        return POLICY_DRIVER

    def to_json(self) -> dict[str, Any]:
        return {"driver": self.driver, "beta": self.beta,
                "noise": self.noise.text() if self.noise else None,
                "takeover": self.takeover.text() if self.takeover else None}


def control_features(control: ControlSpec | None, action_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The per-frame features a controlled job records beside the task's own (none for the expert alone)."""
    if control is None:
        return {}
    return {EXECUTED_ACTION: tuple(action_shape), INTERVENTION: (1,)}


# ------------------------------------------------------------------------------------------- parsing
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def parse_noise(text: str) -> NoiseSpec:
    """``gaussian:SCALE`` or ``gaussian:S1,S2,...`` (one per action dimension), optionally ``@SEG1+SEG2``."""
    match = re.fullmatch(rf"gaussian:({_NUMBER}(?:,{_NUMBER})*)(?:@([\w.-]+(?:\+[\w.-]+)*))?", text.strip())
    if not match:
        raise ControlError(f"--noise {text!r}: expected gaussian:SCALE, gaussian:S1,S2,... (one per action "
                           "dimension) or either followed by @SEGMENT[+SEGMENT...], e.g. gaussian:0.1@grasp")
    scales = tuple(float(s) for s in match.group(1).split(","))
    if any(not math.isfinite(s) or s < 0 for s in scales):
        raise ControlError(f"--noise {text!r}: scales must be finite and >= 0")
    return NoiseSpec(scales, tuple(match.group(2).split("+")) if match.group(2) else ())


def parse_takeover(text: str) -> TakeoverRule:
    """``gap:BOUND:STEPS``: the expert takes over after STEPS steps with the driver's action more than BOUND
    away from its own."""
    match = re.fullmatch(rf"gap:({_NUMBER}):(\d+)", text.strip())
    if not match:
        raise ControlError(f"--takeover {text!r}: unknown rule; the rule is gap:BOUND:STEPS (the expert takes "
                           "over after STEPS steps in a row where the driver's action differs from its own by "
                           "more than BOUND in some dimension), e.g. gap:0.5:3")
    gap, steps = float(match.group(1)), int(match.group(2))
    if not math.isfinite(gap) or gap < 0 or steps < 1:
        raise ControlError(f"--takeover {text!r}: BOUND must be >= 0 and STEPS >= 1")
    return TakeoverRule(gap, steps)


def check_control(control: ControlSpec, action_shape: tuple[int, ...]) -> None:
    """Refuse what cannot apply to a task with this action shape (before anything is written)."""
    if not 0.0 <= control.beta <= 1.0 or not math.isfinite(control.beta):
        raise ControlError(f"--beta {control.beta:g}: must be in [0, 1]")
    if control.driver is None and (control.beta or control.takeover is not None):
        raise ControlError("--beta and --takeover need --driver (a policy to mix with or take over from)")
    if control.noise is not None:
        dims = int(np.prod(action_shape))
        if len(control.noise.scales) not in (1, dims):
            raise ControlError(f"--noise {control.noise.text()!r}: {len(control.noise.scales)} scales for an "
                               f"action of {dims} dimensions; give one scale or {dims}")


# ------------------------------------------------------------------------------------------- policies
class Policy(Protocol):
    """A driver as the executor sees it: one action per recorded observation. ``reset()`` (optional) is called
    before each attempt."""

    def act(self, observation: RecordedObservation) -> Any: ...


class AttemptControl:
    """One attempt's driving: chooses what is executed at each step and counts the expert's takeovers."""

    def __init__(self, spec: ControlSpec, seed: int, action_space: gym.Space, policy: Policy | None) -> None:
        if spec.driver is not None and policy is None:
            raise ValueError("a driven attempt needs its policy")
        self.spec, self.policy, self.action_space = spec, policy, action_space
        self._noise_rng = np.random.default_rng([seed, NOISE_SALT])
        self._beta_rng = np.random.default_rng([seed, POLICY_SALT])
        self._low = getattr(action_space, "low", None)
        self._high = getattr(action_space, "high", None)
        self._gap_run = 0
        self._taken_at: int | None = None  # the segment id where the expert took over
        self.interventions = 0  # takeovers
        reset = getattr(policy, "reset", None)
        if callable(reset):
            _policy_call("reset", reset)

    def choose(self, label: np.ndarray, observation: RecordedObservation, segment_id: int,
               segment: str) -> tuple[np.ndarray, bool]:
        """The action to step and whether the expert drove by a takeover, given the expert's ``label`` for
        ``observation`` (in segment ``segment_id`` named ``segment``)."""
        executed, intervened = label, False
        if self.policy is not None:
            proposed = check_action(_policy_call("act", self.policy.act, observation), self.action_space)
            executed = proposed
            rule = self.spec.takeover
            if self._taken_at is not None and segment_id > self._taken_at:
                self._taken_at = None  # the expert's phase advanced: control goes back to the policy
            if rule is not None and self._taken_at is None:
                differs = float(np.max(np.abs(proposed.astype(np.float64) - label))) > rule.gap
                self._gap_run = self._gap_run + 1 if differs else 0
                if self._gap_run >= rule.steps:
                    self._taken_at, self._gap_run = segment_id, 0
                    self.interventions += 1
            if self._taken_at is not None:
                executed, intervened = label, True
            # Drawn on the steps the policy would drive; the draws depend on the attempt alone.
            elif self._beta_rng.random() < self.spec.beta:
                executed = label
        noise = self.spec.noise
        if noise is not None:
            draw = self._noise_rng.standard_normal(np.shape(executed))
            if not noise.segments or segment in noise.segments:
                scales = np.asarray(noise.scales, dtype=np.float64)
                executed = np.asarray(executed, dtype=np.float64) + draw * (
                    scales.reshape(np.shape(executed)) if scales.size > 1 else scales[0])
                if self._low is not None and self._high is not None:
                    executed = np.clip(executed, self._low, self._high)
                executed = executed.astype(label.dtype, copy=False)
        return np.asarray(executed), intervened


def _policy_call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise TaskError(f"the driving policy's {what}() raised {type(exc).__name__}: {exc}") from exc
