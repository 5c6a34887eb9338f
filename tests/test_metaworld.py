"""Meta-World as a built-in task family: all 50 tasks with their own reactive experts, segmented at the experts'
phase changes, recorded as LeRobot's evaluation env shows them, and suites of them in one resumable store."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from demoforge.pipeline.tasks import metaworld as mw
from demoforge.pipeline.tasks.metaworld_phases import PHASES
from demoforge.pipeline.tasks.registry import get_task, task_names
from demoforge.stages.executor import run_episodes
from demoforge.stages.records import AttemptEnded
from helpers import run_cli

pytestmark = pytest.mark.slow
NO_CAMERA = {"camera": "none"}
SMALL = ("--option", "image_size=64", "--option", "shadows=false", "--option", "antialias=false", "--codec", "h264")


def committed_identity(store: Path) -> list[tuple]:
    from demoforge.storage.store import open_store

    with open_store(store) as view:
        return [(r.episode_index, r.attempt, r.seed, r.frames, r.content_hash, (r.record or {}).get("task"))
                for r in view.committed()]


# ------------------------------------------------------------------------------------------ the family
def test_the_family_is_the_installed_metaworld_and_lerobots_config() -> None:
    import metaworld.env_dict
    from metaworld.policies import ENV_POLICY_MAP

    from demoforge.pipeline.reactive import ReturnBranch

    assert mw.MT10 == tuple(metaworld.env_dict.MT10_V3)
    envs = set(mw.env_names())
    assert len(envs) == 50 and envs == set(metaworld.env_dict.ALL_V3_ENVIRONMENTS) == set(ENV_POLICY_MAP) == set(PHASES)
    names = set(task_names())
    assert {mw.PREFIX + e for e in envs} | {f"metaworld-{s}" for s in ("mt10", "mt50", "easy", "hard")} <= names
    groups = mw.lerobot_config()["DIFFICULTY_TO_TASKS"]
    assert [len(mw.suite_members(s)) for s in ("mt10", "mt50", "easy", "medium", "hard", "very-hard")] == \
        [10, 50, len(groups["easy"]), len(groups["medium"]), len(groups["hard"]), len(groups["very_hard"])]
    for env, phases in PHASES.items():  # the tables fit the experts' code they name
        expert: Any = ENV_POLICY_MAP[env]  # a concrete expert class (the map's type names the abstract base)
        policy = type(expert())
        if phases.branch is None:
            assert ReturnBranch(policy._desired_pos).count == len(phases.targets), env
        grips = ReturnBranch(policy._grab_effort).count if hasattr(policy, "_grab_effort") else 0
        assert all(t < len(phases.targets) and g < grips for t, g in phases.overrides), env
        assert set(phases.names()) <= set(phases.instructions), env
        info = get_task(mw.PREFIX + env).info(NO_CAMERA)
        assert info.instruction == mw.description(env) and info.fps == 80 and info.cameras == ()


def test_the_phase_table_in_the_docs_is_the_code_s() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "tasks.md").read_text()
    rows = {cells[0].strip("` "): [n.strip() for n in cells[2].split(",")]
            for line in text.splitlines() if line.startswith("| `metaworld-")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert rows == {mw.PREFIX + env: list(PHASES[env].names()) for env in mw.env_names()}


@pytest.mark.parametrize("share", [
    "every fifth",  # the suite's sample: 10 tasks across the alphabet
    pytest.param("the rest", marks=pytest.mark.campaign),  # all 50 with tools/campaign_tests.sh
])
def test_every_mt50_task_builds_and_its_expert_is_cut_at_its_phase_changes(share: str) -> None:
    names = mw.env_names()
    sample = names[::5]
    for env_name in sample if share == "every fifth" else [n for n in names if n not in sample]:
        task = mw.PREFIX + env_name
        env: Any = get_task(task).build(NO_CAMERA)
        decided: list[str] = []
        decide = env.expert.decide

        def logging_decide(observation, decide=decide):
            action, phase = decide(observation)
            decided.append(phase.name)
            return action, phase

        env.expert.decide = logging_decide
        try:
            results = [r.result for r in run_episodes(env, task=task, episodes=1, job_seed=3, max_attempts=5)
                       if isinstance(r, AttemptEnded)]
        finally:
            env.close()
        result = results[-1]
        assert result.committable, (task, [r.failure_reason for r in results])
        segments = result.segments
        # one decision per step of the committed attempt; its runs of equal phases are exactly the segments
        runs = [(name, len(list(group))) for name, group in groupby(decided[-result.length:])]
        assert [(s.name, s.length) for s in segments] == runs, task
        assert segments[0].start_step == 0 and segments[-1].end_step == result.length
        assert all(a.end_step == b.start_step for a, b in zip(segments, segments[1:]))
        phases = PHASES[env_name]
        if len(phases.names()) > 1:
            assert len(segments) >= 2, (task, runs)
        for segment in segments:
            assert segment.name in phases.names() and segment.instruction == phases.instructions[segment.name]
            assert segment.target == phases.obj
        assert result.instruction == mw.description(env_name)


def test_frames_and_state_are_what_lerobots_metaworld_env_gives_a_policy() -> None:
    from lerobot.envs.metaworld import MetaworldEnv

    for env_name in ("pick-place-v3",):
        reference = MetaworldEnv(task=env_name, obs_type="pixels_agent_pos")
        ours: Any = get_task(mw.PREFIX + env_name).build({})  # the defaults: corner2, 480x480, shadows
        try:
            expected, _ = reference.reset(seed=11)
            observation, _ = ours.reset(seed=11)
            for step in range(4):
                recorded = ours.demo_record(observation)
                assert np.array_equal(recorded.images[mw.IMAGE_KEY], expected["pixels"]), (env_name, step)
                np.testing.assert_allclose(recorded.state[mw.STATE_KEY], expected["agent_pos"], atol=1e-6)
                action, _phase = ours.expert.decide(observation)
                expected, *_ = reference.step(action)
                observation, *_ = ours.step(action)
        finally:
            reference.close()
            ours.close()


# ------------------------------------------------------------------------------------------ bad input
def test_an_unknown_task_names_the_close_matches(tmp_path) -> None:
    done = run_cli("generate", "--task", "metaworld-pick-place-v2", "--store", str(tmp_path / "s"))
    assert done.returncode == 2
    assert "did you mean metaworld-pick-place-v3" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()


def test_another_metaworld_version_is_refused_at_start(tmp_path, monkeypatch, capsys) -> None:
    import importlib.metadata

    from demoforge.pipeline.cli import main

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.1.1" if name == "metaworld" else real(name))
    code = main(["generate", "--task", "metaworld-push-v3", "--episodes", "1", "--store", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "metaworld 3.1.1 is installed" in err and "metaworld==3.0.0" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("option, message", [("camera=front", "'camera' must be one or more of"),
                                             ("image_size=8", "'image_size' must be in 32..1024"),
                                             ("max_steps=900", "'max_steps' must be in 1..500")])
def test_bad_options_are_named(tmp_path, option, message) -> None:
    done = run_cli("run", "--task", "metaworld-reach-v3", "--episodes", "1", "--option", option)
    assert done.returncode == 2 and message in done.stderr, done.stderr


# ------------------------------------------------------------------------------------------ suites
def test_a_suite_job_commits_each_task_resumes_and_exports_one_task_index_per_task(tmp_path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    store, dataset = tmp_path / "suite", tmp_path / "suite-dataset"
    members = [mw.PREFIX + e for e in mw.suite_members("very-hard")]
    args = ("generate", "--task", "metaworld-very-hard", "--episodes", "1", "--option", "camera=none",
            "--max-attempts", "5")
    done = run_cli(*args, "--store", str(store), "--export", str(dataset))
    assert done.returncode == 0, done.stderr
    assert f"metaworld-very-hard: {len(members)} tasks x 1 episode(s) = {len(members)}" in done.stderr
    assert f"done: {len(members)}/{len(members)} episodes committed" in done.stdout
    identity = committed_identity(store)
    assert Counter(task for *_, task in identity) == {m: 1 for m in members}
    # each member's episodes are its own block of indices (the index names the task in every process)
    assert all(index // 1_000_000 == members.index(task) for index, *_, task in identity)

    status = run_cli("status", "--store", str(store))
    for member in members:
        assert f"{member}: 1 committed" in status.stdout
    again = run_cli(*args, "--store", str(store))  # resumes: nothing left to do
    assert again.returncode == 0 and "(0 this run" in again.stdout

    # the same command gives the same episodes in worker processes (Ray actors: test_scale_out.py)
    twin = tmp_path / "process"
    run = run_cli(*args, "--store", str(twin), "--executor", "process", "--workers", "2")
    assert run.returncode == 0, run.stderr
    assert committed_identity(twin) == identity

    ds = LeRobotDataset("demoforge/suite", root=dataset, video_backend="pyav")
    assert ds.meta.total_tasks == len(members)
    tasks = {int(row["task_index"]): name for name, row in ds.meta.tasks.iterrows()}
    sidecar = [json.loads(line) for line in (dataset / "meta/demoforge_episodes.jsonl").read_text().splitlines()]
    by_member: dict[str, set[int]] = {}
    for episode in range(ds.meta.total_episodes):
        item = ds[int(ds.meta.episodes[episode]["dataset_from_index"])]
        member = sidecar[episode]["task"]
        assert item["task"] == mw.description(member.removeprefix(mw.PREFIX)) == tasks[int(item["task_index"])]
        by_member.setdefault(member, set()).add(int(item["task_index"]))
    assert sorted(by_member) == sorted(members) and all(len(v) == 1 for v in by_member.values())
    assert len({next(iter(v)) for v in by_member.values()}) == len(members)


def test_each_member_records_its_own_first_episode_and_a_closed_member_is_never_rendered() -> None:
    # An attempt found its recorder before the suite became the episode's member: each member's first episode
    # was rendered by the member before it, already closed (its GL context gone, a new one leaked until exit).
    from demoforge.pipeline.tasks.mujoco_gl import render_rgb
    from demoforge.pipeline.tasks.suite import TaskSuiteEnv
    from demoforge.stages.records import AttemptStarted, EpisodeLayout, Frame

    members = ("metaworld-reach-v3", "metaworld-push-v3")
    options = get_task(members[0]).resolve_options({"image_size": 64, "antialias": False, "max_steps": 2})
    built: list[Any] = []

    def build(member: str) -> Any:
        built.append(mw.MetaWorldTask(member.removeprefix(mw.PREFIX), options))
        return built[-1]

    suite = TaskSuiteEnv(members, build)
    seeds, first = {}, {}
    try:
        for record in run_episodes(suite, task="two", episodes=1, max_attempts=1, layout=EpisodeLayout(2),
                                   cameras=get_task(members[0]).info(options).cameras):
            if isinstance(record, AttemptStarted):
                seeds[record.key.episode_index] = record.seed
            elif isinstance(record, Frame) and record.step == 0:
                first[record.key.episode_index] = record.images[mw.IMAGE_KEY]
    finally:
        suite.close()
    assert sorted(first) == [0, 1_000_000] and len(built) == 2
    for index, image in first.items():
        alone = build(members[index // 1_000_000])
        try:
            observation, _ = alone.reset(seed=seeds[index])
            assert np.array_equal(alone.demo_record(observation).images[mw.IMAGE_KEY], image), index
        finally:
            alone.close()
    with pytest.raises(RuntimeError, match="closed env"):
        render_rgb(built[0]._sawyer.mujoco_renderer)


def test_a_task_whose_expert_never_succeeds_is_given_up_and_the_suite_goes_on(tmp_path) -> None:
    store = tmp_path / "very-hard"
    done = run_cli("generate", "--task", "metaworld-very-hard", "--episodes", "1", "--option", "camera=none",
                   "--option", "max_steps=3", "--max-attempts", "1", "--max-consecutive-abandoned", "1",
                   "--store", str(store))
    members = mw.suite_members("very-hard")
    assert done.returncode == 1, done.stderr
    assert f"gave up {len(members)} task(s) of the suite" in done.stderr and "Traceback" not in done.stderr
    for env_name in members:  # every member was tried after the one before was given up
        assert f"{mw.PREFIX}{env_name}: 0/1 committed, 1 episode(s) abandoned" in done.stdout
    with sqlite3.connect(store / "catalog.sqlite") as db:
        reasons = Counter(r for (r,) in db.execute("SELECT terminal_reason FROM attempts"))
    assert reasons == {"truncated": len(members)}  # one attempt each (a Meta-World reset costs about a second)


# ------------------------------------------------------------------------------------- a rendered store
def test_a_rendered_store_exports_loads_and_replays(tmp_path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    store, dataset = tmp_path / "pp", tmp_path / "pp-dataset"
    done = run_cli("generate", "--task", "metaworld-pick-place-v3", "--episodes", "2", *SMALL,
                   "--store", str(store), "--export", str(dataset))
    assert done.returncode == 0, done.stderr
    ds = LeRobotDataset("demoforge/pp", root=dataset, video_backend="pyav")
    assert set(ds.meta.camera_keys) == {"observation.image"} and ds.fps == 80
    item = ds[0]
    assert tuple(item["observation.image"].shape) == (3, 64, 64) and tuple(item["observation.state"].shape) == (4,)
    assert item["task"] == mw.description("pick-place-v3") and tuple(item["action"].shape) == (4,)
    for source in (store, dataset):
        replay = run_cli("replay", str(source), "--images", "--json")
        assert replay.returncode == 0, replay.stderr
        report = json.loads(replay.stdout)
        assert report["summary"] == {"reproduced": 2, "diverged": 0, "error": 0}, report


def test_other_cameras_and_depth_are_options() -> None:
    task = get_task("metaworld-pick-place-v3")
    options = {"image_size": 32, "shadows": False, "camera": "corner2,topview", "depth": True}
    info = task.info(options)
    assert [(c.name, c.kind) for c in info.cameras] == [("corner2", "rgb"), ("topview", "rgb"),
                                                        ("corner2_depth", "depth"), ("topview_depth", "depth")]
    env: Any = task.build(options)
    try:
        observation, _ = env.reset(seed=2)
        recorded = env.demo_record(observation)
    finally:
        env.close()
    assert {k: v.shape for k, v in recorded.images.items()} == {c.name: c.shape for c in info.cameras}
    for name in ("corner2_depth", "topview_depth"):
        depth = recorded.images[name]
        assert depth.dtype == np.float32 and np.isfinite(depth).all() and 0.05 < float(depth.min()) < 3.0
    assert not np.array_equal(recorded.images["corner2"], recorded.images["topview"])


@pytest.mark.slow
def test_full_state_records_the_whole_observation_camera_less_for_state_based_policies(tmp_path) -> None:
    """`full_state=true camera=none`: the env's 39-d observation as observation.environment_state beside the
    4-d agent position, nothing rendered; the export loads with LeRobot and its rows are the env's own."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    store, dataset = tmp_path / "s", tmp_path / "d"
    done = run_cli("generate", "--task", "metaworld-reach-v3", "--episodes", "2", "--option", "camera=none",
                   "--option", "full_state=true", "--store", str(store), "--export", str(dataset))
    assert done.returncode == 0, done.stderr
    ds = LeRobotDataset("demoforge/reach", root=dataset)
    assert ds.meta.camera_keys == []
    assert ds.meta.features[mw.ENV_STATE_KEY]["shape"] == (39,)
    first = ds.hf_dataset.filter(lambda row: row["episode_index"] == 0)
    env_state = np.stack([np.asarray(v) for v in first[mw.ENV_STATE_KEY]])
    agent = np.stack([np.asarray(v) for v in first["observation.state"]])
    assert env_state.shape == (len(first), 39)
    np.testing.assert_array_equal(env_state[:, :4], agent)  # the agent position is the observation's head
    # Frame 0 is the observation reset gives for the committed episode 0's seed, as the env computes it.
    from demoforge.storage.catalog import Catalog

    catalog = Catalog(store)
    try:
        seed = next(r.seed for r in catalog.committed() if r.episode_index == 0)
    finally:
        catalog.close()
    entry = get_task("metaworld-reach-v3")
    env = entry.build(entry.resolve_options({"camera": "none", "full_state": True}))
    try:
        observation, _ = env.reset(seed=seed)
    finally:
        env.close()
    np.testing.assert_array_equal(env_state[0], np.asarray(observation, np.float32))


def test_full_state_adds_the_feature_only_when_asked() -> None:
    entry = get_task("metaworld-push-v3")
    assert set(entry.info(entry.resolve_options({})).state_shapes) == {"observation.state"}
    assert entry.info(entry.resolve_options({"full_state": True})).state_shapes == {
        "observation.state": (4,), mw.ENV_STATE_KEY: (39,)}
