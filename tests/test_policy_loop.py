"""Policy in the loop (stages/control.py): noise injection, a policy that drives while the expert labels, the
expert taking over by a rule, kept policy failures, and bad control options. Meta-World's reactive experts,
camera-less, so the episodes are real and cheap."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from demoforge.pipeline.tasks.metaworld import ENV_STATE_KEY, MetaWorldExpert
from demoforge.pipeline.tasks.registry import get_task
from demoforge.stages.contract import TerminalReason
from demoforge.stages.control import (
    EXECUTED_ACTION,
    INTERVENTION,
    NOISE_SALT,
    ControlSpec,
    NoiseSpec,
    TakeoverRule,
)
from demoforge.stages.executor import run_episodes
from demoforge.stages.records import AttemptEnded, Frame
from demoforge.storage.episode_source import open_episode_source
from demoforge.storage.lerobot.validate import validate_dataset
from helpers import attempts_now, demoforge_argv, kill_once_started, run_cli
from toy_policies import DOWN, Down

pytestmark = pytest.mark.slow  # subprocess jobs of real simulators (the quick tier, -m "not slow", skips them)

PUSH = ("--task", "metaworld-push-v3", "--option", "camera=none", "--option", "full_state=true")


def push_env(**options):
    entry = get_task("metaworld-push-v3")
    options = entry.resolve_options({"camera": "none", "full_state": True, **options})
    return entry.build(options), entry.info(options)


def episodes_of(path: Path) -> list:
    source = open_episode_source(path)
    try:
        return [source.load(ref) for ref in source.episodes()]
    finally:
        source.close()


def test_noise_steps_the_seeded_noise_labels_the_expert_and_replays(tmp_path) -> None:
    """--noise: every frame's action is the expert's for the state it saw, what was stepped is that action
    plus gaussian noise drawn from the attempt's seed (clipped as the env clips), and replay, stepping the
    executed actions, reproduces the episode and finds the expert computing every label."""
    store, dataset = tmp_path / "s", tmp_path / "d"
    done = run_cli("generate", *PUSH, "--episodes", "2", "--seed", "5", "--noise", "gaussian:0.3",
                   "--store", str(store), "--export", str(dataset))
    assert done.returncode == 0, done.stderr
    for ep in episodes_of(dataset):
        assert ep.record["driver"] == "expert+noise" and ep.record["interventions"] == 0
        label, executed = ep.action, ep.state[EXECUTED_ACTION]
        draws = np.random.default_rng([ep.ref.seed, NOISE_SALT]).standard_normal(label.shape)
        np.testing.assert_allclose(executed, np.clip(label + 0.3 * draws, -1, 1), atol=1e-6)
        assert np.abs(executed - label).mean() > 0.1
        assert not ep.state[INTERVENTION].any()
    replay = run_cli("replay", str(dataset), "--json")
    assert replay.returncode == 0, replay.stderr
    report = json.loads(replay.stdout)
    assert [e["verdict"] for e in report["episodes"]] == ["reproduced", "reproduced"]
    assert all("computes the recorded action at every frame" in e["expert"] for e in report["episodes"])


def test_noise_only_in_the_named_segments() -> None:
    env, info = push_env()
    noisy = info.segment_names[0]
    control = ControlSpec(noise=NoiseSpec((0.5,), (noisy,)))
    try:
        records = list(run_episodes(env, task=info.name, episodes=1, control=control))
    finally:
        env.close()
    (end,) = [r for r in records if isinstance(r, AttemptEnded)]
    name = {s.segment_id: s.name for s in end.result.segments}
    frames = [r for r in records if isinstance(r, Frame)]
    inside = [r for r in frames if name[r.annotations.segment_id] == noisy]
    outside = [r for r in frames if name[r.annotations.segment_id] != noisy]
    assert inside and outside
    assert all(not np.array_equal(r.state[EXECUTED_ACTION], r.action) for r in inside)
    assert all(np.array_equal(r.state[EXECUTED_ACTION], r.action) for r in outside)


def expected_takeovers(labels: np.ndarray, segments: np.ndarray, rule: TakeoverRule) -> tuple[np.ndarray, int]:
    """The rule, worked out from the recorded labels and segments: which frames the expert drove."""
    flags, run, taken, count = np.zeros(len(labels), bool), 0, None, 0
    for t, (label, segment) in enumerate(zip(labels, segments)):
        if taken is not None and segment > taken:
            taken = None
        if taken is None:
            run = run + 1 if np.max(np.abs(DOWN - label)) > rule.gap else 0
            if run >= rule.steps:
                taken, run, count = segment, 0, count + 1
        flags[t] = taken is not None
    return flags, count


def test_a_policy_drives_the_expert_labels_every_state_and_takes_over_by_the_rule() -> None:
    """--driver with --takeover gap:0.5:3: each frame's label is the expert's action for the observation the
    policy saw; the policy's action is stepped except where the rule handed control to the expert (marked
    intervention there and nowhere else); the record counts the takeovers."""
    env, info = push_env()
    rule = TakeoverRule(0.5, 3)
    policies: list[Down] = []

    def make() -> Down:
        policies.append(Down())
        return policies[-1]

    control = ControlSpec(driver="toy_policies:down", takeover=rule)
    try:
        records = list(run_episodes(env, task=info.name, episodes=2, control=control,
                                    make_policy=lambda: _adapt(make())))
    finally:
        env.close()
    expert = MetaWorldExpert("push-v3")
    ends = [r for r in records if isinstance(r, AttemptEnded)]
    assert len(policies) == 1 and policies[0].resets == len(ends)  # one policy per row, reset per attempt
    for end in ends:
        frames = [r for r in records if isinstance(r, Frame) and r.key == end.key]
        labels = np.stack([f.action for f in frames])
        for f in frames:  # the expert is reactive: its label depends on the observation alone (recorded as
            # float32, so within its rounding; replay checks labels exactly against the env's own state)
            np.testing.assert_allclose(f.action, expert.decide(f.state[ENV_STATE_KEY])[0], atol=1e-5)
        segments = np.array([f.annotations.segment_id for f in frames])
        flags, count = expected_takeovers(labels, segments, rule)
        recorded = np.array([bool(f.state[INTERVENTION][0]) for f in frames])
        np.testing.assert_array_equal(recorded, flags)
        assert count >= 1 and end.result.interventions == count and end.result.driver == "policy"
        executed = np.stack([f.state[EXECUTED_ACTION] for f in frames])
        np.testing.assert_array_equal(executed[flags], labels[flags])
        assert (executed[~flags] == DOWN).all()


def _adapt(policy: Down):
    from demoforge.pipeline.policies import FeaturePolicy

    return FeaturePolicy(policy, "toy_policies:down")


def test_policy_rollouts_are_kept_when_they_fail_and_edit_selects_them(tmp_path) -> None:
    """A policy that drives alone fails (the env truncates): its rollouts are committed all the same (every
    label is the expert's), export and validate, and `edit --keep-where` selects on driver and success."""
    store, dataset = tmp_path / "s", tmp_path / "d"
    done = run_cli("generate", *PUSH, "--option", "max_steps=80", "--episodes", "2", "--driver", "toy_policies:down",
                   "--store", str(store), "--export", str(dataset))
    assert done.returncode == 0, done.stderr
    assert "2/2 episodes committed" in done.stdout and "discarded attempts: none" in done.stdout, done.stdout
    episodes = episodes_of(dataset)
    assert [e.record["terminal_reason"] for e in episodes] == [TerminalReason.TRUNCATED.value] * 2
    assert all(e.record["driver"] == "policy" and not e.record["success"] for e in episodes)
    assert all((e.state[EXECUTED_ACTION] == DOWN).all() for e in episodes)
    report = validate_dataset(dataset)  # in this process: the CLI would pay LeRobot's import again
    assert report.status == 0, report.to_json()
    rows = pq.read_table(next(dataset.glob("data/chunk-*/file-*.parquet"))).to_pandas()
    for _, frames in rows.groupby("episode_index"):  # lerobot-eval's flags: done at the end, never a success
        assert frames["next.done"].tolist() == [False] * (len(frames) - 1) + [True]
        assert not frames["next.success"].any()
    kept = run_cli("edit", str(dataset), "--keep-where", 'driver == "policy" and not success and interventions == 0',
                   "--out", str(tmp_path / "kept"))
    assert kept.returncode == 0, kept.stderr
    none = run_cli("edit", str(dataset), "--keep-where", 'driver == "expert"', "--out", str(tmp_path / "none"))
    assert none.returncode != 0 and "no episode" in (none.stdout + none.stderr).lower(), none.stdout + none.stderr


def test_the_process_executor_makes_the_same_driven_episodes_as_threads(tmp_path) -> None:
    args = (*PUSH, "--option", "max_steps=100", "--episodes", "2", "--driver", "toy_policies:down", "--takeover",
            "gap:0.5:3", "--noise",
            "gaussian:0.05")
    hashes = []
    for executor in ("thread", "process"):
        store = tmp_path / executor
        done = run_cli("generate", *args, "--executor", executor, "--store", str(store))
        assert done.returncode == 0, done.stderr
        from demoforge.storage.catalog import Catalog

        catalog = Catalog(store)
        try:
            hashes.append(sorted((r.episode_index, r.content_hash) for r in catalog.committed()))
        finally:
            catalog.close()
    assert hashes[0] == hashes[1]


@pytest.mark.parametrize("args, message", [
    (("--noise", "gaussian:-1"), "--noise 'gaussian:-1': scales must be finite and >= 0"),
    (("--noise", "gaussian:0.1,0.1,0.1"), "3 scales for an action of 4 dimensions"),
    (("--noise", "uniform:0.1"), "--noise 'uniform:0.1': expected gaussian:SCALE"),
    (("--driver", "toy_policies:down", "--beta", "1.5"), "--beta 1.5: must be in [0, 1]"),
    (("--beta", "0.5"), "--beta and --takeover need --driver"),
    (("--driver", "toy_policies:down", "--takeover", "slow"), "--takeover 'slow': unknown rule"),
    (("--noise", "gaussian:0.1@nosuchseg"), "task 'metaworld-push-v3' has no segment 'nosuchseg'; its segments are "
                                            "reach, descend, grasp, push"),
    (("--takeover", ""), "--takeover '': --beta and --takeover need --driver"),
    (("--beta", "0"), "--beta 0.0: --beta and --takeover need --driver"),
    (("--driver", "toy_policies:down", "--takeover", ""), "--takeover '': unknown rule"),
    (("--driver", ""), "--driver '': name a LeRobot checkpoint folder or module:factory"),
    (("--driver", "toy_policies:down", "--policy-timeout", "90"), "--policy-timeout 90 s must be below the step "
                                                                  "timeout (60 s, --step-timeout)"),
    (("--driver", "toy_policies:unbuildable"), "--driver toy_policies:unbuildable: building the policy raised "
                                               "RuntimeError: the factory cannot build the policy"),
    (("--driver", "no_such_module:make"), "--driver no_such_module:make: importing module 'no_such_module'"),
    (("--driver", "missing/pretrained_model"), "--driver 'missing/pretrained_model': no such folder"),
    (("--driver", "."), "not a LeRobot policy checkpoint (no config.json"),
])
def test_bad_control_options_are_refused_naming_the_option(tmp_path, args, message) -> None:
    store = tmp_path / "s"
    done = run_cli("generate", *PUSH, "--episodes", "1", *args, "--store", str(store))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not store.exists()


def test_an_expert_that_cannot_label_other_states_is_refused_at_start(tmp_path) -> None:
    store = tmp_path / "s"
    done = run_cli("generate", "--task", "toy-point", "--episodes", "1", "--noise", "gaussian:0.1",
                   "--store", str(store))
    assert done.returncode == 2 and "cannot label states it did not choose" in done.stderr, done.stderr
    assert not store.exists()


def driven_ends(env, info, driver: str, **control) -> tuple[list[AttemptEnded], list[Frame]]:
    """One episode of two attempts driven by ``driver`` (a toy policy): the attempts' ends and the frames."""
    from demoforge.pipeline.policies import policy_factory

    records = list(run_episodes(env, task=info.name, episodes=1, max_attempts=2,
                                control=ControlSpec(driver=driver, **control),
                                make_policy=policy_factory(driver, info)))
    return [r for r in records if isinstance(r, AttemptEnded)], [r for r in records if isinstance(r, Frame)]


def test_the_policy_boundary_fails_the_attempt_naming_the_driver() -> None:
    """Whatever a policy does (raises, calls sys.exit, returns NaN, the wrong shape or dtype, writes into the
    arrays the frame records) fails its attempt with a PolicyError whose message starts with the --driver, and
    the next attempt runs."""
    env, info = push_env()
    cases = {"broken": "act() raised RuntimeError: the policy's weights are gone",
             "exits": "act() called sys.exit(3)",
             "nan": "act() returned an unusable action: action contains NaN or inf: [nan nan nan nan]",
             "wrong_shape": "act() returned an unusable action: action has shape (3,); the env expects (4,)",
             "wrong_dtype": "act() returned an unusable action: action has dtype <U2; expected a numeric array",
             "writes_its_input": "act() raised ValueError: output array is read-only"}
    try:
        for name, detail in cases.items():
            ends, _ = driven_ends(env, info, f"toy_policies:{name}")
            assert len(ends) == 2, name
            for end in ends:
                assert end.result.terminal_reason is TerminalReason.ERROR and end.result.error_type == "PolicyError"
                assert (end.result.error or "").startswith(f"--driver toy_policies:{name}: {detail} (at task "
                                                           "'metaworld-push-v3', segment 0:'reach', step 0)"), \
                    end.result.error
    finally:
        env.close()


def test_a_hanging_policy_is_abandoned_at_its_time_limit_and_built_again() -> None:
    """A policy call that does not return fails its attempt after policy_timeout_s, naming the driver; the hung
    policy is not called again: the next attempt builds a new one."""
    import toy_policies

    env, info = push_env()
    built = toy_policies.BUILT["hangs"]
    try:
        ends, _ = driven_ends(env, info, "toy_policies:hangs", policy_timeout_s=0.2)
    finally:
        toy_policies.RELEASE.set()  # the abandoned threads return and end
        env.close()
    assert [e.result.error_type for e in ends] == ["PolicyError", "PolicyError"]
    assert all((e.result.error or "").startswith("--driver toy_policies:hangs: act() did not return within 0.2 s "
                                                 "(--policy-timeout); the call was abandoned") for e in ends), ends
    assert toy_policies.BUILT["hangs"] - built == 2  # one per attempt: the hung one is not called again


def test_a_huge_policy_action_is_executed_and_recorded_clipped() -> None:
    """An action of 1e30 is clipped to the action space's bounds, as the env clips it: executed_action records
    what the env executed, never 1e30 (whose statistics overflow)."""
    env, info = push_env(max_steps=5)
    try:
        ends, frames = driven_ends(env, info, "toy_policies:huge")
    finally:
        env.close()
    assert [e.result.terminal_reason for e in ends] == [TerminalReason.TRUNCATED]  # a kept policy failure
    executed = np.stack([f.state[EXECUTED_ACTION] for f in frames])
    assert len(frames) == 5 and (executed == 1.0).all(), executed


def test_the_policy_boundary_catches_what_a_policy_call_does_itself() -> None:
    """The boundary alone: a value, an exception, SystemExit and a call past its limit, each its own way."""
    from demoforge.stages.control import GuardedPolicy, PolicyError

    release = threading.Event()

    class Moody:
        def __init__(self) -> None:
            self.mode = "ok"

        def act(self, observation):
            if self.mode == "exit":
                sys.exit("bye")
            if self.mode == "hang":
                release.wait()
            return observation

    policy = Moody()
    seven: Any = 7  # what the policy sees does not matter here
    guarded = GuardedPolicy(policy, "mine:moody", timeout_s=0.2)
    assert guarded.act(seven) == 7
    policy.mode = "exit"
    with pytest.raises(PolicyError, match=r"^--driver mine:moody: act\(\) called sys.exit\('bye'\)"):
        guarded.act(seven)
    policy.mode = "hang"
    try:
        with pytest.raises(PolicyError, match="did not return within 0.2 s"):
            guarded.act(seven)
        assert guarded.hung
        with pytest.raises(PolicyError, match="an earlier call did not return"):
            guarded.act(seven)
    finally:
        release.set()


def test_eval_of_the_expert_as_a_policy_gives_the_experts_own_success(tmp_path) -> None:
    """`demoforge eval` of Meta-World's push expert, wrapped as a state-based policy: per episode, the success
    the expert has driving those seeds itself (one attempt each), and the expert's phases all reached."""
    done = run_cli("eval", *PUSH, "--driver", "toy_policies:push_expert", "--episodes", "4", "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    env, info = push_env()
    try:
        own = [r.result for r in run_episodes(env, task=info.name, episodes=4, job_seed=3, max_attempts=1)
               if isinstance(r, AttemptEnded)]
    finally:
        env.close()
    assert [(e["seed"], e["success"]) for e in report["per_episode"]] == [(r.seed, r.success) for r in own]
    assert report["successes"] == sum(r.success for r in own) and report["episodes"] == 4
    assert report["success_rate"] >= 0.75 and list(report["reach"]) == list(info.segment_names)
    assert report["reach"][info.segment_names[-1]] >= 0.75
    low, high = report["ci95"]
    assert low <= report["success_rate"] <= high


REACH = ("--task", "metaworld-reach-v3", "--option", "image_size=64", "--option", "antialias=false")


def test_eval_of_a_failing_exiting_or_hanging_policy_counts_failed_episodes_and_ends(tmp_path) -> None:
    """`eval` runs each of its N episodes once: one whose policy failed is a failed episode with its reason,
    never replaced (a failing policy used to be evaluated for ever), on either executor; a policy call that
    hangs is given up at --policy-timeout and sys.exit() in a policy is its failure, not the command's exit."""
    done = run_cli("eval", *REACH, "--driver", "toy_policies:nan", "--episodes", "2", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["episodes"], report["successes"], report["errors"]) == (2, 0, 2), report
    assert all(e["outcome"].startswith("error: --driver toy_policies:nan: act() returned an unusable action: action "
                                       "contains NaN") for e in report["per_episode"]), report
    exits = run_cli("eval", *REACH, "--driver", "toy_policies:exits", "--episodes", "1", "--executor", "process",
                    timeout=120)
    assert exits.returncode == 0, exits.stderr
    assert "success 0/1 = 0%" in exits.stdout and "1 x error: --driver toy_policies:exits: act() called sys.exit(3)" \
        in exits.stdout, exits.stdout
    store = tmp_path / "rollouts"
    hangs = run_cli("eval", *REACH, "--driver", "toy_policies:hangs", "--episodes", "1", "--policy-timeout", "0.5",
                    "--store", str(store), timeout=120)
    assert hangs.returncode == 0, hangs.stderr
    assert "1 episode(s) ended by an error" in hangs.stdout and "1 x error: --driver toy_policies:hangs: act() did " \
        "not return within 0.5 s (--policy-timeout)" in hangs.stdout, hangs.stdout
    assert [r.state for r in attempts_now(store)] == ["discarded"]


def test_generate_stops_a_policy_that_fails_every_attempt_naming_the_driver(tmp_path) -> None:
    done = run_cli("generate", *REACH, "--codec", "h264", "--episodes", "1", "--driver", "toy_policies:exits",
                   "--max-attempts", "1", "--max-consecutive-abandoned", "1", "--store", str(tmp_path / "s"),
                   timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "last error: --driver toy_policies:exits: act() called sys.exit(3)" in done.stderr, done.stderr
    assert "fix the policy (--driver toy_policies:exits)" in done.stderr and "Traceback" not in done.stderr


def test_a_fixed_set_of_episodes_runs_each_index_of_every_member_once() -> None:
    """An evaluation's planner (index_limit): each of the N indices of every member of a suite runs once and an
    abandoned one is not replaced, so the job ends."""
    import anyio

    from demoforge.stages.plan import EpisodePlanner
    from demoforge.stages.records import EpisodeAssignment, EpisodeLayout
    from demoforge.storage.catalog import ResumeState

    planner = EpisodePlanner(2, ResumeState(frozenset(), {}), max_attempts=1, max_consecutive_abandoned=0,
                             layout=EpisodeLayout(2), index_limit=2)

    async def drive() -> list[int]:
        send, receive = anyio.create_memory_object_stream[EpisodeAssignment](0)
        planned = []
        with anyio.fail_after(10):  # an abandoned index replaced would plan for ever
            async with anyio.create_task_group() as tg:
                tg.start_soon(planner.run, send)
                async with receive:
                    async for assignment in receive:
                        planned.append(assignment.episode_index)
                        planner.finished(assignment.episode_index, committed=False, last_error="the policy failed")
        return planned

    assert anyio.run(drive) == [0, 1, 1_000_000, 1_000_001]
    assert planner.done


@pytest.fixture(scope="module")
def act_checkpoints(tmp_path_factory):
    from toy_policies import write_act_checkpoint

    root = tmp_path_factory.mktemp("act")
    write_act_checkpoint(root / "push", state_dim=4)
    write_act_checkpoint(root / "wrong", state_dim=7)
    return root


def test_a_lerobot_checkpoint_drives_and_one_of_other_features_is_refused(tmp_path, act_checkpoints) -> None:
    store = tmp_path / "rollouts"
    done = run_cli("eval", *PUSH, "--option", "max_steps=60", "--driver", str(act_checkpoints / "push"),
                   "--episodes", "1", "--store", str(store), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # LeRobot's own loading notes do not reach the report's stdout
    assert report["episodes"] == 1 and report["successes"] == 0 and report["store"] == str(store), report
    (ep,) = episodes_of(store)
    assert ep.record["driver"] == "policy" and np.isfinite(ep.state[EXECUTED_ACTION]).all()
    assert np.abs(ep.state[EXECUTED_ACTION] - ep.action).max() > 0  # the policy drove, the expert labelled
    wrong = run_cli("eval", *PUSH, "--driver", str(act_checkpoints / "wrong"), "--episodes", "1")
    assert wrong.returncode == 2, wrong.stderr
    assert "the checkpoint's features do not match the task: observation.state (7,) (the task records (4,))" \
        in wrong.stderr and "Traceback" not in wrong.stderr, wrong.stderr
    no_env_state = run_cli("generate", "--task", "metaworld-push-v3", "--option", "camera=none", "--episodes", "1",
                           "--driver", str(act_checkpoints / "push"), "--store", str(tmp_path / "s"))
    assert no_env_state.returncode == 2 and "observation.environment_state (39,) (the task records no such " \
        "feature)" in no_env_state.stderr, no_env_state.stderr
    assert not (tmp_path / "s").exists()


def _spoil(folder: Path, how: str) -> None:
    if how == "no weights":
        (folder / "model.safetensors").unlink()
    elif how == "truncated weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:5000])
    elif how == "no preprocessor":
        (folder / "policy_preprocessor.json").unlink()
    elif how == "truncated preprocessor state":
        (state,) = folder.glob("policy_preprocessor_step_*.safetensors")
        state.write_bytes(state.read_bytes()[:100])
    else:
        (folder / "config.json").write_text(how)


@pytest.mark.parametrize("how, message", [
    ("no weights", "building the policy raised FileNotFoundError"),
    ("truncated weights", "building the policy raised SafetensorError"),
    ("no preprocessor", "building the policy raised"),
    ("truncated preprocessor state", "building the policy raised"),
    ('{"type": "act"}', "config.json declares no input"),
    ('{"type": ', "not a LeRobot policy checkpoint"),
])
def test_a_broken_checkpoint_is_refused_before_anything_is_written(tmp_path, act_checkpoints, how, message) -> None:
    """A checkpoint whose weights or processors are missing or cut, or whose config declares nothing: one
    PolicyLoadError naming --driver where the job starts (the CLI's one line, exit 2), whatever the executor."""
    import shutil

    from demoforge.pipeline.policies import check_driver, policy_factory
    from demoforge.pipeline.policy_io import PolicyLoadError

    folder = tmp_path / "pretrained_model"
    shutil.copytree(act_checkpoints / "push", folder)
    _spoil(folder, how)
    entry = get_task("metaworld-push-v3")
    info = entry.info(entry.resolve_options({"camera": "none", "full_state": True}))
    with pytest.raises(PolicyLoadError) as refused:
        check_driver(policy_factory(str(folder), info), str(folder))
    text = str(refused.value)
    assert text.startswith("--driver ") and folder.name in text.split(":")[0], text
    assert message in text and "\n" not in text and len(text) < 700, text


def test_a_killed_noise_job_resumes_to_the_same_episodes(tmp_path) -> None:
    """The noise is drawn from each attempt's seed: a job SIGKILLed after its first commit and re-run ends with
    exactly the episodes of a job that was never interrupted, byte for byte."""
    args = ("generate", *PUSH, "--episodes", "6", "--noise", "gaussian:0.2")
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    assert run_cli(*args, "--store", str(clean)).returncode == 0
    assert kill_once_started(demoforge_argv(*args, "--store", str(killed)),
                             lambda: bool(attempts_now(killed, ("committed",))), 0)
    assert len(attempts_now(killed, ("committed",))) < 6
    resumed = run_cli(*args, "--store", str(killed))
    assert resumed.returncode == 0, resumed.stderr

    def identity(store: Path) -> list[tuple]:
        return sorted((r.episode_index, r.attempt, r.seed, r.content_hash)
                      for r in attempts_now(store, ("committed",)))

    assert identity(killed) == identity(clean)
