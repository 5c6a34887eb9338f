"""Policy in the loop (stages/control.py): noise injection, a policy that drives while the expert labels, the
expert taking over by a rule, kept policy failures, and bad control options. Meta-World's reactive experts,
camera-less, so the episodes are real and cheap."""

from __future__ import annotations

import json
from pathlib import Path

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


def push_env():
    entry = get_task("metaworld-push-v3")
    options = entry.resolve_options({"camera": "none", "full_state": True})
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


def test_a_failing_policy_fails_its_attempt_naming_the_policy() -> None:
    env, info = push_env()
    from demoforge.pipeline.policies import policy_factory

    control = ControlSpec(driver="toy_policies:broken")
    try:
        records = list(run_episodes(env, task=info.name, episodes=1, max_attempts=2, control=control,
                                    make_policy=policy_factory("toy_policies:broken", info)))
    finally:
        env.close()
    ends = [r for r in records if isinstance(r, AttemptEnded)]
    assert len(ends) == 2 and all(e.result.terminal_reason is TerminalReason.ERROR for e in ends)
    assert "the driving policy's act() raised RuntimeError: the policy's weights are gone" in (ends[0].result.error or "")


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
