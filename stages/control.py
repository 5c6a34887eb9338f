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

The policy boundary (:class:`GuardedPolicy`): whatever a driving policy does (raises, calls ``sys.exit``, hangs
past ``policy_timeout_s``, returns NaN, the wrong shape or dtype) ends its attempt with a :class:`PolicyError`
that names ``--driver``; a huge action is clipped to the action space's bounds, as the env clips it.
"""

from __future__ import annotations

import enum
import math
import queue
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from demoforge.stages.actions import check_action
from demoforge.stages.contract import POLICY_DRIVER, ActionError, DemoError, RecordedObservation

EXECUTED_ACTION = "executed_action"  # the action the env was stepped with, per frame
INTERVENTION = "intervention"  # 1 where the expert drove because a takeover rule fired, else 0
NOISE_SALT, POLICY_SALT = 0x4E015E, 0xBE7A  # separate generators for noise and for the beta draw
# How long one call of a driving policy (act, reset) may take before its attempt fails (--policy-timeout). Below
# the env workers' step watchdog (60 s by default), which would otherwise fire first and blame the env.
DEFAULT_POLICY_TIMEOUT_S = 30.0


class ControlOption(enum.Enum):
    """A control option, as :class:`ControlError` names it (a command line words it as its flag)."""

    NOISE = "noise"
    DRIVER = "driver"
    BETA = "beta"
    TAKEOVER = "takeover"
    POLICY_TIMEOUT = "policy timeout"


class ControlError(ValueError):
    """A control option is malformed or cannot apply: ``option``, the ``value`` given (as text; None when the
    problem is not about one value) and the ``problem``, whose parts may name other options. :meth:`worded`
    names the options as the caller's user knows them (the CLI: its flags); ``str()`` by their plain names."""

    def __init__(self, option: ControlOption, value: str | None, *problem: str | ControlOption) -> None:
        self.option, self.value, self.problem = option, value, problem
        super().__init__(self.worded())

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes with its facts
        return type(self), (self.option, self.value, *self.problem)

    def worded(self, names: Mapping[ControlOption, str] | None = None) -> str:
        def name(option: ControlOption) -> str:
            return option.value if names is None else names[option]

        text = "".join(name(part) if isinstance(part, ControlOption) else part for part in self.problem)
        return text if self.value is None else f"{name(self.option)} {self.value}: {text}"


class PolicyError(DemoError, RuntimeError):
    """The driving policy (``--driver``) failed its attempt: it raised or exited, did not return within its time
    limit, or returned something that is not an action of the env. The message names the driver first."""

    def __init__(self, message: str, *, driver: str = "?", **where: Any) -> None:
        self.driver = driver
        super().__init__(message, **where)

    def _render(self) -> str:
        return f"--driver {self.driver}: {self.detail} (at {self.where()})"


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
    (``module:factory`` or a LeRobot checkpoint folder), None for the expert. ``policy_timeout_s``: how long
    one call of the policy may take (None: no limit); not part of the store's fingerprint."""

    noise: NoiseSpec | None = None
    driver: str | None = None
    beta: float = 0.0
    takeover: TakeoverRule | None = None
    policy_timeout_s: float | None = DEFAULT_POLICY_TIMEOUT_S

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
        raise ControlError(ControlOption.NOISE, repr(text), "expected gaussian:SCALE, gaussian:S1,S2,... (one per "
                           "action dimension) or either followed by @SEGMENT[+SEGMENT...], e.g. gaussian:0.1@grasp")
    scales = tuple(float(s) for s in match.group(1).split(","))
    if any(not math.isfinite(s) or s < 0 for s in scales):
        raise ControlError(ControlOption.NOISE, repr(text), "scales must be finite and >= 0")
    return NoiseSpec(scales, tuple(match.group(2).split("+")) if match.group(2) else ())


def parse_takeover(text: str) -> TakeoverRule:
    """``gap:BOUND:STEPS``: the expert takes over after STEPS steps with the driver's action more than BOUND
    away from its own."""
    match = re.fullmatch(rf"gap:({_NUMBER}):(\d+)", text.strip())
    if not match:
        raise ControlError(ControlOption.TAKEOVER, repr(text), "unknown rule; the rule is gap:BOUND:STEPS (the "
                           "expert takes over after STEPS steps in a row where the driver's action differs from its "
                           "own by more than BOUND in some dimension), e.g. gap:0.5:3")
    gap, steps = float(match.group(1)), int(match.group(2))
    if not math.isfinite(gap) or gap < 0 or steps < 1:
        raise ControlError(ControlOption.TAKEOVER, repr(text), "BOUND must be >= 0 and STEPS >= 1")
    return TakeoverRule(gap, steps)


def check_control(control: ControlSpec, action_shape: tuple[int, ...]) -> None:
    """Refuse what cannot apply to a task with this action shape (before anything is written)."""
    if not 0.0 <= control.beta <= 1.0 or not math.isfinite(control.beta):
        raise ControlError(ControlOption.BETA, f"{control.beta:g}", "must be in [0, 1]")
    if control.driver is None and (control.beta or control.takeover is not None):
        option = ControlOption.BETA if control.beta else ControlOption.TAKEOVER
        raise ControlError(option, None, ControlOption.BETA, " and ", ControlOption.TAKEOVER, " need ",
                           ControlOption.DRIVER, " (a policy to mix with or take over from)")
    if control.driver is not None and not control.driver.strip():
        raise ControlError(ControlOption.DRIVER, "''", "name a LeRobot checkpoint folder or module:factory")
    timeout = control.policy_timeout_s
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout <= 86_400):
        raise ControlError(ControlOption.POLICY_TIMEOUT, repr(timeout), "must be in (0, 86400] seconds")
    if control.noise is not None:
        dims = int(np.prod(action_shape))
        if len(control.noise.scales) not in (1, dims):
            raise ControlError(ControlOption.NOISE, repr(control.noise.text()), f"{len(control.noise.scales)} "
                               f"scales for an action of {dims} dimensions; give one scale or {dims}")


def check_segments(control: ControlSpec, segment_names: Sequence[str], task: str) -> None:
    """Refuse ``--noise ...@SEGMENT`` naming a segment the task does not have (it would never apply)."""
    noise = control.noise
    if noise is None or not noise.segments:
        return
    wanted = noise.segments
    if not segment_names:
        raise ControlError(ControlOption.NOISE, repr(noise.text()), f"task {task!r} declares no segment names, so "
                           "noise cannot be limited to segments; leave out @SEGMENT")
    unknown = [name for name in wanted if name not in segment_names]
    if unknown:
        raise ControlError(ControlOption.NOISE, repr(noise.text()), f"task {task!r} has no segment "
                           f"{', '.join(repr(n) for n in unknown)}; its segments are {', '.join(segment_names)}")


# ------------------------------------------------------------------------------------------- policies
class Policy(Protocol):
    """A driver as the executor sees it: one action per recorded observation. ``reset()`` (optional) is called
    before each attempt."""

    def act(self, observation: RecordedObservation) -> Any: ...


def describe_failure(exc: BaseException) -> str:
    """What a policy's (or its factory's) exception says, on one line and bounded (it ends up in the catalog and
    in one-line messages): "raised ValueError: ..." or "called sys.exit(3)"."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    text = " ".join(str(exc).split())
    return f"raised {type(exc).__name__}" + (f": {text[:300]}" if text else "")


class _CallTimeout(Exception):
    """A call did not return within its limit; its thread was abandoned."""


class _Reply:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class BoundedCalls:
    """Runs calls on a daemon thread of its own, so that one that does not return within its limit can be given
    up: Python cannot stop a thread, so the hung one is left blocked (whatever it returns is dropped) and the next
    call gets a fresh thread. An idle thread ends after ``idle_s``; the next call starts another."""

    def __init__(self, name: str, idle_s: float = 5.0) -> None:
        self.name = name
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], _Reply]] | None = None

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None) -> _Reply:
        """Run ``fn(*args)``; the reply holds its value or whatever it raised (BaseException included).
        Raises :class:`_CallTimeout` when it has not returned within ``timeout_s`` (None: wait for ever)."""
        reply = _Reply()
        with self._lock:
            if self._requests is None:
                self._requests = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._requests,), name=self.name, daemon=True).start()
            self._requests.put((fn, args, reply))
        if not reply.done.wait(timeout_s):
            with self._lock:
                if not reply.done.is_set():
                    self._requests = None  # abandoned: the hung thread ends if its call ever returns
                    raise _CallTimeout
        return reply

    def _serve(self, requests: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], _Reply]]) -> None:
        while True:
            try:
                fn, args, reply = requests.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._requests is requests and not requests.empty():
                        continue
                    if self._requests is requests:
                        self._requests = None
                    return
            try:
                reply.value = fn(*args)
            except BaseException as exc:  # anything the call does is the caller's to judge (SystemExit too)
                reply.error = exc
            reply.done.set()
            del fn, args, reply
            if self._requests is not requests:
                return  # this thread was given up while its call ran


def bounded_call(fn: Callable[[], Any], timeout_s: float | None, name: str) -> Any:
    """``fn()`` on a thread of its own, given up after ``timeout_s``: raises what it raised (BaseException
    included) or ``TimeoutError``."""
    try:
        reply = BoundedCalls(name, idle_s=0.0).call(fn, (), timeout_s)
    except _CallTimeout:
        raise TimeoutError(f"did not return within {timeout_s:g} s") from None
    if reply.error is not None:
        raise reply.error
    return reply.value


class GuardedPolicy:
    """The policy boundary: a driving policy whose every call (``reset``, ``act``) runs on a thread of its own,
    bounded by ``timeout_s`` (None: no limit). Anything the call does (raise, ``sys.exit``, not return in time)
    becomes a :class:`PolicyError` naming ``driver``. After a call timed out the policy is ``hung``: its state is
    unknown and its thread still busy, so the executor builds a new one for the next attempt."""

    def __init__(self, policy: Policy, driver: str, timeout_s: float | None = DEFAULT_POLICY_TIMEOUT_S) -> None:
        self.policy, self.driver, self.timeout_s = policy, driver, timeout_s
        self.hung = False
        self._calls = BoundedCalls(f"policy {driver}")

    def reset(self) -> None:
        reset = getattr(self.policy, "reset", None)
        if callable(reset):
            self.call("reset", reset)

    def act(self, observation: RecordedObservation) -> Any:
        return self.call("act", self.policy.act, observation)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.hung:
            raise PolicyError(f"{what}(): an earlier call did not return, so the policy is not called again",
                              driver=self.driver)
        if self.timeout_s is None:
            return _policy_call(self.driver, what, fn, *args)
        try:
            reply = self._calls.call(fn, args, self.timeout_s)
        except _CallTimeout:
            self.hung = True
            raise PolicyError(f"{what}() did not return within {self.timeout_s:g} s (--policy-timeout); the call "
                              "was abandoned", driver=self.driver) from None
        if reply.error is not None:
            raise PolicyError(f"{what}() {describe_failure(reply.error)}", driver=self.driver) from reply.error
        return reply.value


class AttemptControl:
    """One attempt's driving: chooses what is executed at each step and counts the expert's takeovers."""

    def __init__(self, spec: ControlSpec, seed: int, action_space: gym.Space, policy: Policy | None) -> None:
        if spec.driver is not None and policy is None:
            raise ValueError("a driven attempt needs its policy")
        self.spec, self.policy, self.action_space = spec, policy, action_space
        self.driver = spec.driver or "?"
        self._noise_rng = np.random.default_rng([seed, NOISE_SALT])
        self._beta_rng = np.random.default_rng([seed, POLICY_SALT])
        self._low = getattr(action_space, "low", None)
        self._high = getattr(action_space, "high", None)
        self._gap_run = 0
        self._taken_at: int | None = None  # the segment id where the expert took over
        self.interventions = 0  # takeovers
        reset = getattr(policy, "reset", None)
        if callable(reset):
            _policy_call(self.driver, "reset", reset)

    def _proposal(self, observation: RecordedObservation) -> np.ndarray:
        """The policy's action for ``observation``, checked and clipped to the action space as the env clips it."""
        assert self.policy is not None
        raw = _policy_call(self.driver, "act", self.policy.act, observation)
        try:
            return check_action(raw, self.action_space, clip=True)
        except ActionError as exc:
            raise PolicyError(f"act() returned an unusable action: {exc.detail}", driver=self.driver) from None

    def choose(self, label: np.ndarray, observation: RecordedObservation, segment_id: int,
               segment: str) -> tuple[np.ndarray, bool]:
        """The action to step and whether the expert drove by a takeover, given the expert's ``label`` for
        ``observation`` (in segment ``segment_id`` named ``segment``)."""
        executed, intervened = label, False
        if self.policy is not None:
            proposed = self._proposal(observation)
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


def _policy_call(driver: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call the policy; anything it raises (``sys.exit`` too) is a :class:`PolicyError` naming ``driver``. A
    :class:`GuardedPolicy` has done so already; Ctrl-C in the calling thread still stops the job."""
    try:
        return fn(*args)
    except (PolicyError, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise PolicyError(f"{what}() {describe_failure(exc)}", driver=driver) from exc
