"""The segment contract and the executor on a tiny deterministic env."""

from __future__ import annotations

import functools
import json

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demoforge.stages.contract import (
    ActionError,
    EnvError,
    EpisodeResult,
    Segment,
    TaskError,
    TaskProtocolError,
    TerminalReason,
)
from demoforge.stages.executor import RangeWorkSource, Executor, derive_seed, run_episodes
from demoforge.stages.records import AttemptEnded, AttemptStarted, EpisodeAbandoned, Frame
from toy_env import HoldingPointEnv, PointEnv, SegSpec


def split(records):
    frames = [r for r in records if isinstance(r, Frame)]
    ended = [r for r in records if isinstance(r, AttemptEnded)]
    return frames, ended


def annotations_of(frames):
    return np.array([f.annotations.as_tuple() for f in frames])


def check_annotation_invariants(frames, result: EpisodeResult) -> None:
    a = annotations_of(frames)
    valid, ep_step, seg_id, seg_step, seg_start, seg_end, terminated, truncated = a.T
    n = len(frames)
    assert n == result.length
    assert (valid == 1).all()
    assert list(ep_step) == list(range(n))
    # Segment ids start at 0, are contiguous and never decrease.
    assert seg_id[0] == 0 and set(np.diff(seg_id)) <= {0, 1}
    for sid in np.unique(seg_id):
        rows = np.flatnonzero(seg_id == sid)
        assert list(seg_step[rows]) == list(range(len(rows)))
        assert seg_start[rows].sum() == 1 and seg_start[rows[0]] == 1
        assert seg_end[rows].sum() == 1 and seg_end[rows[-1]] == 1
        span = result.segments[sid]
        assert (span.start_step, span.end_step) == (rows[0], rows[-1] + 1)
    # Terminal flags only on the last frame.
    assert terminated[:-1].sum() == 0 and truncated[:-1].sum() == 0
    if result.committable:
        assert terminated[-1] == 1 and truncated[-1] == 0


plans = st.lists(st.builds(SegSpec, name=st.sampled_from(["reach", "grasp", "place", "x"]),
                           steps=st.integers(1, 6), delta=st.floats(-2, 2, allow_nan=False)),
                 min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(plan=plans, seed=st.integers(0, 2**31))
def test_annotation_invariants_hold_for_any_plan(plan, seed):
    env = PointEnv(plan)
    frames, (ended,) = split(list(run_episodes(env, task="toy", episodes=1, job_seed=seed)))
    result = ended.result
    assert result.terminal_reason is TerminalReason.SUCCESS and result.committable
    assert [s.name for s in result.segments] == [p.name for p in plan]
    assert result.length == sum(p.steps for p in plan)
    check_annotation_invariants(frames, result)


@settings(max_examples=30, deadline=None)
@given(plans=st.lists(plans, min_size=2, max_size=4), episodes=st.integers(1, 6))
def test_vector_rows_are_independent_episodes(plans, episodes):
    """Rows finish at different steps; each row's frames form a valid episode of its own plan."""
    envs = [PointEnv(p) for p in plans]
    vec = gym.vector.SyncVectorEnv([functools.partial(lambda e: e, e) for e in envs],
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    records = list(run_episodes(vec, task="toy", episodes=episodes))
    frames, ended = split(records)
    assert sorted(e.key.episode_index for e in ended) == list(range(episodes))
    for e in ended:
        own = [f for f in frames if f.key == e.key]
        assert e.result.committable and e.frames == len(own)
        assert e.result.length == sum(p.steps for p in plans[e.result.row])
        check_annotation_invariants(own, e.result)
        # The seed is the one derived from the episode identity, whatever row ran it.
        assert e.result.seed == derive_seed(0, e.key.episode_index, 0)


def test_finished_rows_hold_still_and_stop_recording():
    short, long = HoldingPointEnv([SegSpec("a", 2)]), PointEnv([SegSpec("a", 7, delta=1.0)])
    vec = gym.vector.SyncVectorEnv([lambda: short, lambda: long], autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    records = list(run_episodes(vec, task="toy", episodes=2))
    frames, ended = split(records)
    by_row = {e.result.row: e for e in ended}
    assert by_row[0].frames == 2 and by_row[1].frames == 7
    # Row 0 finished after 2 steps and was stepped 5 more times with its hold action, recording nothing.
    assert short.hold_calls == 5
    assert short.actions_log == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert sum(1 for f in frames if f.key == by_row[0].key) == 2
    # Without a task hold action the default is zeros (no motion).
    short2, long2 = PointEnv([SegSpec("a", 1)]), PointEnv([SegSpec("a", 3)])
    vec2 = gym.vector.SyncVectorEnv([lambda: short2, lambda: long2],
                                    autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    list(run_episodes(vec2, task="toy", episodes=2))
    assert short2.actions_log == [1.0, 0.0, 0.0]


def test_failed_row_retries_without_disturbing_others():
    """Row 0's first attempt fails validation; it is retried while row 1's episode runs on untouched."""

    class FlakyEnv(PointEnv):
        plans = 0

        def create_demo_segments(self):
            self.plans += 1
            ok = self.plans > 1  # this plan's verdict, fixed when it is made
            yield Segment(actions=[np.ones(1, np.float32)] * 2, name="a", validator=lambda view: ok)

    flaky, steady = FlakyEnv(), PointEnv([SegSpec("long", 8)])
    vec = gym.vector.SyncVectorEnv([lambda: flaky, lambda: steady], autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    records = list(run_episodes(vec, task="toy", episodes=2))
    frames, ended = split(records)
    outcomes = [(e.key.episode_index, e.key.attempt, e.result.terminal_reason) for e in ended]
    assert (0, 0, TerminalReason.SEGMENT_VALIDATION_FAILED) in outcomes
    assert (0, 1, TerminalReason.SUCCESS) in outcomes
    steady_end = next(e for e in ended if e.result.row == 1)
    assert steady_end.result.committable and steady_end.frames == 8
    assert steady.resets == 2  # initial full reset + its own attempt; never reset by row 0's retry
    assert [f.step for f in frames if f.key == steady_end.key] == list(range(8))


def test_legacy_action_list_is_one_segment():
    class Legacy(PointEnv):
        create_demo_segments = None  # type: ignore[assignment]  # a legacy task only has the flat action list

        def create_demo_action_list(self):
            return [np.array([0.5], np.float32)] * 4

    frames, (ended,) = split(list(run_episodes(Legacy(), task="legacy-toy", episodes=1)))
    assert [s.name for s in ended.result.segments] == ["legacy"]
    assert ended.result.committable and len(frames) == 4
    check_annotation_invariants(frames, ended.result)


def test_legacy_resolves_through_wrappers():
    class Legacy(PointEnv):
        create_demo_segments = None  # type: ignore[assignment]  # a legacy task only has the flat action list

        def create_demo_action_list(self):
            return [np.array([1.0], np.float32)] * 3

    wrapped = gym.wrappers.TimeLimit(gym.wrappers.RecordEpisodeStatistics(Legacy()), max_episode_steps=100)
    _, (ended,) = split(list(run_episodes(wrapped, task="wrapped", episodes=1)))
    assert ended.result.committable and ended.result.length == 3


def test_lazy_planning_reads_the_state_the_previous_segment_left():
    env = PointEnv([SegSpec("a", 3, delta=2.0), SegSpec("b", 2, delta=-1.0), SegSpec("c", 1)])
    _, (ended,) = split(list(run_episodes(env, task="toy", episodes=1)))
    x0 = float(ended.result.seed % 7)
    assert env.positions_seen_by_planner == [x0, x0 + 6.0, x0 + 4.0]
    assert [s.metadata["start_x"] for s in ended.result.segments] == [x0, x0 + 6.0, x0 + 4.0]


def test_closed_loop_actions_are_computed_after_the_previous_step():
    class ClosedLoop(PointEnv):
        def create_demo_segments(self):
            def toward(target):
                while abs(self.x - target) > 1e-6:
                    yield np.array([np.clip(target - self.x, -1, 1)], np.float32)
            yield Segment(actions=toward(10.0), name="go")

    env = ClosedLoop()
    frames, (ended,) = split(list(run_episodes(env, task="toy", episodes=1)))
    assert ended.result.committable
    assert env.x == pytest.approx(10.0)
    assert len(frames) == int(np.ceil(10.0 - ended.result.seed % 7))


def test_validator_failure_discards_and_retries_up_to_max_attempts():
    env = PointEnv([SegSpec("a", 2), SegSpec("b", 2, valid=False), SegSpec("never", 2)])
    records = list(run_episodes(env, task="toy", episodes=1, max_attempts=3))
    frames, ended = split(records)
    assert [e.key.attempt for e in ended] == [0, 1, 2]
    assert all(e.result.terminal_reason is TerminalReason.SEGMENT_VALIDATION_FAILED for e in ended)
    assert all(not e.result.committable for e in ended)
    r = ended[0].result
    assert [(s.name, s.success) for s in r.segments] == [("a", True), ("b", False)]
    assert r.failure_reason == "b: validator rejected the segment"
    assert r.length == 4  # "never" was never planned
    abandoned = [x for x in records if isinstance(x, EpisodeAbandoned)]
    assert abandoned == [EpisodeAbandoned(0, 3, "b: validator rejected the segment")]
    # Each attempt has its own seed.
    assert len({e.result.seed for e in ended}) == 3


def test_empty_segment_and_empty_plan():
    _, (e1,) = split(list(run_episodes(PointEnv([SegSpec("a", 2), SegSpec("hollow", 0)]), task="t",
                                       episodes=1, max_attempts=1)))
    assert e1.result.terminal_reason is TerminalReason.EMPTY_SEGMENT and not e1.result.committable
    assert e1.result.segments[-1].name == "hollow" and not e1.result.segments[-1].success
    frames, (e2,) = split(list(run_episodes(PointEnv([]), task="t", episodes=1, max_attempts=1)))
    assert e2.result.terminal_reason is TerminalReason.EMPTY_PLAN and frames == [] and not e2.result.committable


def test_truncation_on_the_last_action_is_a_failure():
    env = PointEnv([SegSpec("a", 5)], max_steps=5)
    frames, (ended,) = split(list(run_episodes(env, task="toy", episodes=1, max_attempts=1)))
    assert ended.result.terminal_reason is TerminalReason.TRUNCATED and not ended.result.committable
    assert frames[-1].annotations.truncated and frames[-1].annotations.segment_end
    assert not any(f.annotations.truncated for f in frames[:-1])


def test_success_check_decides_at_plan_end():
    _, (ended,) = split(list(run_episodes(PointEnv([SegSpec("a", 2)], success=False), task="toy",
                                          episodes=1, max_attempts=1)))
    assert ended.result.terminal_reason is TerminalReason.TASK_INCOMPLETE and not ended.result.committable


def test_env_termination_ends_the_episode():
    ok = PointEnv([SegSpec("a", 3), SegSpec("b", 5)], terminate_at=4)
    frames, (ended,) = split(list(run_episodes(ok, task="toy", episodes=1, max_attempts=1)))
    assert ended.result.committable and ended.result.length == 4 and frames[-1].annotations.terminated
    check_annotation_invariants(frames, ended.result)
    bad = PointEnv([SegSpec("a", 3), SegSpec("b", 5)], terminate_at=4, success=False)
    _, (ended,) = split(list(run_episodes(bad, task="toy", episodes=1, max_attempts=1)))
    assert ended.result.terminal_reason is TerminalReason.FAILURE


def test_observation_before_action_pairs():
    env = PointEnv([SegSpec("a", 3, delta=2.0)])
    frames, (ended,) = split(list(run_episodes(env, task="toy", episodes=1)))
    x0 = float(ended.result.seed % 7)
    assert [float(f.state["observation.state"][0]) for f in frames] == [x0, x0 + 2, x0 + 4]
    assert [f.reward for f in frames] == [x0 + 2, x0 + 4, x0 + 6]


# ------------------------------------------------------------------------------------------ bad input
class BadTask(PointEnv):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def create_demo_segments(self):
        yield Segment(actions=[np.ones(1, np.float32)] * 3, name="fine")
        if self.kind == "not-a-segment":
            yield {"actions": []}
        good = np.ones(1, np.float32)
        bad = {"shape": np.ones(3, np.float32), "nan": np.array([np.nan], np.float32),
               "text": np.array(["a"])}.get(self.kind, good)
        yield Segment(actions=[good, good, bad], name="broken")


@pytest.mark.parametrize("kind, error, step, segment", [
    ("not-a-segment", TaskProtocolError, 3, "fine"),
    ("shape", ActionError, 5, "broken"),
    ("nan", ActionError, 5, "broken"),
    ("text", ActionError, 5, "broken"),
])
def test_bad_task_output_is_a_typed_error_naming_task_segment_and_step(kind, error, step, segment):
    records = list(run_episodes(BadTask(kind), task="bad-task", episodes=1, max_attempts=2))
    _, ended = split(records)
    assert len(ended) == 2  # discarded and counted: both attempts used, the process carries on
    r = ended[0].result
    assert r.terminal_reason is TerminalReason.ERROR and not r.committable
    assert r.error_type == error.__name__
    assert "task 'bad-task'" in r.error and f"step {step}" in r.error and repr(segment) in r.error
    assert isinstance(records[-1], EpisodeAbandoned)


def test_env_raising_mid_episode_is_an_env_error():
    env = PointEnv([SegSpec("a", 3), SegSpec("b", 3)], raise_at=4)
    _, ended = split(list(run_episodes(env, task="boom", episodes=1, max_attempts=2)))
    assert len(ended) == 2
    r = ended[0].result
    assert r.error_type == EnvError.__name__
    assert "task 'boom'" in r.error and "segment 1:'b'" in r.error and "step 4" in r.error
    assert "simulated physics blow-up" in r.error


def test_task_code_raising_is_a_task_error():
    class Raises(PointEnv):
        def create_demo_segments(self):
            yield Segment(actions=[np.ones(1, np.float32)], name="a")
            raise ZeroDivisionError("planner bug")

    _, ended = split(list(run_episodes(Raises(), task="t", episodes=1, max_attempts=1)))
    assert ended[0].result.error_type == TaskError.__name__ and "planner bug" in ended[0].result.error


def test_camera_changing_size_is_an_observation_error():
    class Growing(PointEnv):
        def demo_record(self, observation):
            from demoforge.stages.contract import RecordedObservation
            size = 8 if self.t < 2 else 9
            return RecordedObservation(state={"s": observation}, images={"cam": np.zeros((size, 8, 3), np.uint8)})

    _, ended = split(list(run_episodes(Growing([SegSpec("a", 4)]), task="t", episodes=1, max_attempts=1)))
    assert ended[0].result.error_type == "ObservationError"
    assert "camera 'cam' changed" in ended[0].result.error and "step 2" in ended[0].result.error


def test_metadata_must_be_json_safe():
    class BadMeta(PointEnv):
        def create_demo_segments(self):
            yield Segment(actions=[np.ones(1, np.float32)], name="a", metadata={"x": object()})

    _, ended = split(list(run_episodes(BadMeta(), task="t", episodes=1, max_attempts=1)))
    assert ended[0].result.error_type == TaskProtocolError.__name__ and "metadata" in ended[0].result.error


def test_env_without_a_plan_is_refused_clearly():
    _, ended = split(list(run_episodes(gym.make("CartPole-v1"), task="cartpole", episodes=1, max_attempts=1)))
    assert "neither create_demo_segments() nor create_demo_action_list()" in ended[0].result.error


# ------------------------------------------------------------------------------------ records, seeds
def test_episode_record_round_trips_as_json_with_schema_version():
    env = PointEnv([SegSpec("a", 2), SegSpec("b", 1)])
    _, (ended,) = split(list(run_episodes(env, task="toy", episodes=1)))
    record = json.loads(json.dumps(ended.result.to_record(), allow_nan=False))
    assert record["schema_version"] == 1
    assert [s["name"] for s in record["segments"]] == ["a", "b"]
    assert EpisodeResult.from_record(record) == ended.result
    with pytest.raises(ValueError, match="schema_version"):
        EpisodeResult.from_record({**record, "schema_version": 99})


def test_seeds_are_a_pure_function_of_job_episode_and_attempt():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    seeds = {derive_seed(s, e, a) for s in range(3) for e in range(20) for a in range(3)}
    assert len(seeds) == 180
    started = [r for r in run_episodes(PointEnv([SegSpec("a", 1)]), task="t", episodes=3, job_seed=7)
               if isinstance(r, AttemptStarted)]
    assert [r.seed for r in started] == [derive_seed(7, e, 0) for e in range(3)]


def test_interrupt_stops_all_rows_and_discards_in_flight():
    env = PointEnv([SegSpec("a", 100)])
    calls = {"n": 0}

    def interrupt():
        calls["n"] += 1
        return calls["n"] > 5

    records = list(Executor(env, task="t", interrupt=interrupt).run(RangeWorkSource(10)))
    frames, ended = split(records)
    assert len(ended) == 1 and ended[0].result.terminal_reason is TerminalReason.INTERRUPTED
    assert not ended[0].result.committable and not ended[0].result.counts_as_attempt
    assert len(frames) == 5


def test_autoreset_vector_env_is_refused():
    vec = gym.vector.SyncVectorEnv([lambda: PointEnv()] * 2)
    with pytest.raises(TaskProtocolError, match="AutoresetMode.DISABLED"):
        Executor(vec, task="t")


def test_a_holding_row_that_hits_its_step_limit_is_reset_quietly():
    """Row 0 finishes early and holds while row 1 runs past row 0's step limit."""
    short, long = PointEnv([SegSpec("a", 2)], max_steps=4), PointEnv([SegSpec("a", 9)], max_steps=50)
    vec = gym.vector.SyncVectorEnv([lambda: short, lambda: long], autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    frames, ended = split(list(run_episodes(vec, task="toy", episodes=2)))
    assert all(e.result.committable for e in ended)
    assert sorted(e.frames for e in ended) == [2, 9]
    assert short.resets >= 2  # reset again while holding, unrecorded
