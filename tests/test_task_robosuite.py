"""The built-in "robosuite-lift" task: robosuite 1.5.2's Lift with OSC_POSE delta control and a reactive expert;
its episodes succeed in segments, replay from the export, and a plain robosuite env (built here, not through
demoforge) driven by the recorded actions retraces the recorded end-effector and cube trajectory."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import json  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.registry import TaskOptionError, get_task  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import AttemptStarted  # noqa: E402
from helpers import run_cli  # noqa: E402
from task_checks import check_segments_cover, ended, frames_of  # noqa: E402

TASK = "robosuite-lift"
EPISODES = 2
SEGMENTS = ("reach", "grasp", "lift")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lift() -> Iterator[list[Any]]:
    env = get_task(TASK).build({"camera": "none"})
    try:
        yield list(run_episodes(env, task=TASK, episodes=EPISODES, job_seed=0, max_attempts=1))
    finally:
        env.close()


def test_the_expert_lifts_the_cube_through_reach_grasp_lift(lift):
    assert len(ended(lift)) == EPISODES
    for end in ended(lift):
        assert end.result.committable, (end.result.episode_index, end.result.failure_reason)
        check_segments_cover(end, lift, SEGMENTS, "cube")


def _plain_lift(seed: int) -> Any:
    """Lift as robosuite's own documentation builds it, with the arguments the task declares (not its code)."""
    import robosuite
    from robosuite.controllers import load_composite_controller_config

    return robosuite.make("Lift", robots="Panda", seed=seed, hard_reset=False, has_renderer=False,
                          has_offscreen_renderer=False, use_camera_obs=False, control_freq=20, horizon=500,
                          reward_shaping=False,
                          controller_configs=load_composite_controller_config(controller="BASIC", robot="Panda"))


def test_a_plain_robosuite_env_retraces_the_episode(lift):
    """The recorded actions, stepped in a plain robosuite Lift seeded with the attempt's seed, give the recorded
    end-effector and cube positions at every step, and robosuite's own success at the end."""
    (started,) = [r for r in lift if isinstance(r, AttemptStarted) and r.key.episode_index == 0]
    frames = frames_of(lift, 0)
    env = _plain_lift(started.seed)
    try:
        observation = env.reset()
        for frame in frames:
            state, objects = frame.state["observation.state"], frame.state["observation.environment_state"]
            np.testing.assert_allclose(state[:3], observation["robot0_eef_pos"], atol=1e-5)
            np.testing.assert_allclose(objects[:3], observation["cube_pos"], atol=1e-5)
            observation, *_ = env.step(np.asarray(frame.action, dtype=np.float64))
        assert env._check_success()
    finally:
        env.close()


@pytest.mark.parametrize("options, named", [({"camera": "frontview"}, "camera"), ({"image_size": 8}, "image_size"),
                                            ({"max_steps": 501}, "max_steps"), ({"cube": "red"}, "cube"),
                                            ({"antialias": "yes"}, "antialias")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)


@pytest.mark.campaign  # 45 s; tests/test_robosuite_tasks.py checks every task's frames against robosuite's
def test_a_job_with_both_cameras_exports_named_features_and_replays(tmp_path: Path):
    store, dataset = tmp_path / "store", tmp_path / "ds"
    done = run_cli("generate", "--task", TASK, "--option", "image_size=64", "--option", "antialias=false",
                   "--episodes", "1", "--store", str(store),
                   "--export", str(dataset), "--codec", "h264", timeout=600)
    assert done.returncode == 0, done.stderr
    features = json.loads((dataset / "meta" / "info.json").read_text())["features"]
    assert features["observation.state"]["names"][:3] == ["robot0_eef_pos.x", "robot0_eef_pos.y", "robot0_eef_pos.z"]
    assert features["observation.environment_state"]["shape"] == [10]
    assert {"observation.images.agentview", "observation.images.robot0_eye_in_hand"} <= set(features)
    replayed = run_cli("replay", str(dataset), "--json", "--images")
    report = json.loads(replayed.stdout)
    assert replayed.returncode == 0, (replayed.stderr, report)
    assert report["summary"] == {"reproduced": 1, "diverged": 0, "error": 0}


def test_the_pose_to_action_conversion_inverts_the_commanded_pose():
    """What `demoforge multiply` relies on (OSC_POSE: a delta from the pose reached): the action toward the pose
    an action commands is that action."""
    env: Any = get_task(TASK).build({"camera": "none"})
    try:
        env.reset(seed=3)
        poses = env.demo_poses()
        action = np.array([0.3, -0.2, 0.1, 0.1, -0.2, 0.4, 1.0], dtype=np.float32)
        np.testing.assert_allclose(poses.action_toward(poses.commanded_pose(action), 1.0), action, atol=1e-6)
    finally:
        env.close()


@pytest.mark.campaign  # 45 s of CLI jobs; tests/test_multiply.py multiplies fetch, Meta-World and SO-101 sources
def test_lift_episodes_are_multiplied_and_replay(tmp_path: Path):
    """The task's poses let `demoforge multiply` make new episodes from two sources; they replay."""
    source, store, dataset = tmp_path / "source", tmp_path / "store", tmp_path / "ds"
    made = run_cli("generate", "--task", TASK, "--option", "camera=none", "--episodes", "2", "--store", str(source))
    assert made.returncode == 0, made.stderr
    result = run_cli("multiply", str(source), "--episodes", "1", "--seed", "5", "--max-attempts", "10",
                     "--store", str(store), "--export", str(dataset), timeout=600)
    assert result.returncode == 0, result.stderr
    replayed = run_cli("replay", str(dataset), "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["summary"] == {"reproduced": 1, "diverged": 0, "error": 0}


def test_a_randomized_scene_is_drawn_on_the_model_its_episode_runs():
    """robosuite loads a model per seed; the draw comes after that load, so the episode runs the drawn physics
    and placement range (drawn before the reload, they would be lost), and with every axis on the expert still
    lifts the cube."""
    env: Any = get_task(TASK).build({"camera": "none", "randomize": "all", "randomize.init.scale": 1.5})
    try:
        drawn = env.demo_randomize(11)
        env.reset(seed=11)
        suite = env.unwrapped.suite_env
        plain = _plain_lift(11)
        try:
            plain.reset()
            cube = suite.cube_body_id
            assert suite.sim.model.body_mass[cube] == pytest.approx(plain.sim.model.body_mass[cube] *
                                                                    drawn["physics"]["mass"])
        finally:
            plain.close()
        assert drawn["init"]["ObjectSampler"]["x_range"] == pytest.approx([-0.045, 0.045])
        assert suite.placement_initializer.x_range == pytest.approx([-0.045, 0.045])
        ends = ended(list(run_episodes(env, task=TASK, episodes=1, job_seed=0, max_attempts=1)))
        assert [end.result.committable for end in ends] == [True]
    finally:
        env.close()
