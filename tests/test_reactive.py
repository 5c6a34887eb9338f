"""A reactive expert (observation -> action) becomes lazily planned segments cut exactly at its phase changes."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from demoforge.pipeline.reactive import Phase, PolicyExpert, ReturnBranch, reactive_segments
from demoforge.stages.contract import RecordedObservation, TaskError, TaskProtocolError
from demoforge.stages.executor import run_episodes
from demoforge.stages.records import AttemptEnded, Frame


class ShuttleEnv(gym.Env):
    """x starts at the seed mod 5; each step adds the action; terminates (success) once x has been to 10 and back
    to 0. The expert is reactive: it reads x and whether 10 was reached from the observation."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-100, 100, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-2, 2, shape=(1,), dtype=np.float32)
        self.x, self.reached = 0.0, False
        self.last: np.ndarray | None = None
        self.expert = PolicyExpert(act=self._act, phase=self._phase)
        self.decisions: list[tuple[float, str]] = []  # (x, phase) of every decision, to check the cuts

    def _obs(self) -> np.ndarray:
        return np.array([self.x, float(self.reached)], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.x, self.reached = float((seed or 0) % 5), False
        self.last = self._obs()
        return self.last, {}

    def step(self, action):
        self.x += float(np.asarray(action).reshape(-1)[0])
        self.reached = self.reached or self.x >= 10
        self.last = self._obs()
        done = self.reached and self.x <= 0
        return self.last, 0.0, done, False, {"success": done}

    @staticmethod
    def _act(observation: np.ndarray) -> np.ndarray:
        return np.array([-2.0 if observation[1] else 2.0], dtype=np.float32)

    def _phase(self, observation: np.ndarray) -> Phase:
        name = "back" if observation[1] else "out"
        self.decisions.append((float(observation[0]), name))
        return Phase(name, instruction=f"go {name}", target="x", metadata={"dir": name})

    def create_demo_segments(self):
        return reactive_segments(self.expert, lambda: self.last)

    def demo_record(self, observation) -> RecordedObservation:
        return RecordedObservation(state={"observation.state": observation})


def _run(env: gym.Env, episodes: int = 1, **kwargs: Any) -> tuple[list[Any], list[Frame]]:
    results, frames = [], []
    for record in run_episodes(env, task="shuttle", episodes=episodes, **kwargs):
        if isinstance(record, AttemptEnded):
            results.append(record.result)
        elif isinstance(record, Frame):
            frames.append(record)
    return results, frames


def test_segments_end_exactly_where_the_phase_changes() -> None:
    env = ShuttleEnv()
    [result], frames = _run(env)
    assert result.committable, result.failure_reason
    assert [s.name for s in result.segments] == ["out", "back"]
    out, back = result.segments
    # seed -> x0 in 0..4; "out" runs until the step whose observation first has reached=1: x steps by 2
    x0 = frames[0].state["observation.state"][0]
    steps_out = int(np.ceil((10 - x0) / 2))
    assert (out.start_step, out.end_step) == (0, steps_out)
    assert back.start_step == out.end_step and back.end_step == result.length
    # the frame annotations agree with the spans, and every action of a segment is its phase's action
    for frame in frames:
        seg = out if frame.step < out.end_step else back
        assert frame.annotations.segment_id == seg.segment_id
        assert frame.annotations.segment_start == (frame.step == seg.start_step)
        assert frame.annotations.segment_end == (frame.step == seg.end_step - 1)
        assert float(frame.action[0]) == (2.0 if seg.name == "out" else -2.0)
    assert back.instruction == "go back" and back.target == "x" and back.metadata == {"dir": "back"}
    # one decision per step: the expert was never asked twice for the same step (the cut keeps the decision)
    assert len(env.decisions) == result.length


def test_a_phase_can_come_back_and_becomes_a_new_segment() -> None:
    class Flicker(ShuttleEnv):
        def _phase(self, observation):  # "far" / "near" 5 around a threshold the walk crosses twice
            return Phase("near" if 4 <= observation[0] <= 8 else "far")

    [result], _frames = _run(Flicker())
    names = [s.name for s in result.segments]
    assert names[0] in ("far", "near") and len(names) >= 3
    assert all(a != b for a, b in zip(names, names[1:]))  # a boundary only where the phase changes
    assert all(s.length > 0 for s in result.segments)


def test_truncation_without_success_is_discarded_and_retried() -> None:
    class Stuck(ShuttleEnv):
        @staticmethod
        def _act(observation):
            return np.array([0.0], dtype=np.float32)

    env = gym.wrappers.TimeLimit(Stuck(), max_episode_steps=12)
    results, _ = _run(env, max_attempts=2)
    assert [r.terminal_reason.value for r in results] == ["truncated", "truncated"]
    assert all(r.segments and r.segments[0].name == "out" for r in results)


def test_a_bad_decision_is_a_typed_error_naming_the_expert() -> None:
    class Broken(ShuttleEnv):
        def create_demo_segments(self):
            class Bad:
                def decide(self, observation):
                    return np.zeros(1, np.float32)  # no phase

            return reactive_segments(Bad(), lambda: self.last)

    [result], _ = _run(Broken(), max_attempts=1)
    assert result.error_type in (TaskProtocolError.__name__, TaskError.__name__)
    assert "expected (action, Phase)" in (result.error or "")


def _branchy(x: float) -> str:
    if x < 0:
        return "negative"
    elif x == 0:
        return "zero"
    return "positive"


def _raises(x: float) -> int:
    if x > 0:
        raise ValueError("boom")
    return 1


def test_return_branch_names_the_return_statement_in_source_order() -> None:
    probe = ReturnBranch(_branchy)
    assert probe.count == 3
    for value, ordinal in ((-1.0, 0), (0.0, 1), (5.0, 2)):
        probe.clear()
        _branchy(value)
        assert probe.last() == ordinal
    probe.clear()
    assert probe.last() is None  # not called since the clear
    raising = ReturnBranch(_raises)
    raising.clear()
    with pytest.raises(ValueError):
        _raises(1.0)
    assert raising.last() is None  # a raise is no return


def test_return_branch_is_per_thread() -> None:
    probe = ReturnBranch(_branchy)
    probe.clear()
    _branchy(-3.0)
    seen: list[int | None] = []

    def other() -> None:
        probe.clear()
        _branchy(9.0)
        seen.append(probe.last())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [2] and probe.last() == 0


def test_return_branch_refuses_a_python_it_is_not_tested_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """It reads CPython bytecode: on another version it says so, typed, before watching anything."""
    from demoforge.pipeline import reactive

    monkeypatch.setattr(reactive, "RETURN_BRANCH_PYTHONS", ((3, 11),))
    with pytest.raises(reactive.ReturnBranchUnsupported, match=r"CPython 3\.11 bytecode; this is cpython 3\.12") as info:
        ReturnBranch(_branchy)
    assert info.value.version == (3, 12) and info.value.implementation == "cpython"
