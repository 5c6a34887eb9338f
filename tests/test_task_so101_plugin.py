"""The built-in "so101-plugin-pick-cube" task: lerobot-env-so101's SO101PickCube-v0 (LeRobot's --env.type=so101)
with our reactive expert. Its episodes pick the cube in named segments; the plugin's own env, built as LeRobot's
config builds it, retraces them from the recorded actions; an export loads in LeRobot's LeRobotDataset with the
features the plugin gives a policy; and `lerobot-train` on it and `lerobot-eval --env.type=so101` of the
checkpoint run with no renaming."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import json  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.registry import TaskDefinitionError, TaskOptionError, get_task  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import AttemptEnded, AttemptStarted  # noqa: E402
from helpers import run_cli  # noqa: E402
from task_checks import check_segments_cover, ended, frames_of  # noqa: E402

TASK = "so101-plugin-pick-cube"
EPISODES = 2
SEGMENTS = ("stretch", "reach", "descend", "grasp", "lift")
STATE, ENV_STATE = "observation.state", "observation.environment_state"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def picks() -> Iterator[list[Any]]:
    env = get_task(TASK).build()
    try:
        # up to 3 attempts an episode, as a job makes: one attempt in five drops the cube (tools/bench_so101_plugin.py)
        yield list(run_episodes(env, task=TASK, episodes=EPISODES, job_seed=0, max_attempts=3))
    finally:
        env.close()


def _of_attempt(records: list[Any], end: AttemptEnded) -> list[Any]:
    """The records of ``end``'s attempt alone (an episode's failed attempts carry the same episode index)."""
    return [r for r in records if getattr(r, "key", None) == end.key]


def _committed(records: list[Any]) -> list[AttemptEnded]:
    return [end for end in ended(records) if end.result.committable]


def test_the_expert_picks_the_cube_through_named_segments(picks):
    assert sorted(end.result.episode_index for end in _committed(picks)) == list(range(EPISODES))
    for end in _committed(picks):
        attempt = _of_attempt(picks, end)
        check_segments_cover(end, attempt, SEGMENTS, "cube")
        last = frames_of(attempt, end.result.episode_index)[-1]
        # the env's own success ended the episode within its 100 steps, with its sparse reward
        assert last.annotations.terminated and last.reward == 1.0 and end.frames <= 100


def _plugin_env_as_lerobot_builds_it() -> Any:
    """SO101PickCube-v0 from the plugin's own LeRobot config (what `--env.type=so101` makes), with the block drawn
    at random as the task's default draws it."""
    import gymnasium as gym
    import lerobot_env_so101  # noqa: F401 - registers the env ids
    from lerobot_env_so101.configuration_so101 import SO101Env

    config = SO101Env(random_block_position=True)
    return gym.make(config.gym_id, disable_env_checker=config.disable_env_checker, **config.gym_kwargs)


def test_the_plugins_own_env_retraces_an_episode_from_its_actions(picks):
    """Every recorded state is the plugin env's observation before the recorded action (agent_pos, environment_state),
    and the env reports its own success after the last one."""
    (committed,) = [end for end in _committed(picks) if end.result.episode_index == 0]
    attempt = _of_attempt(picks, committed)
    (started,) = [r for r in attempt if isinstance(r, AttemptStarted)]
    env = _plugin_env_as_lerobot_builds_it()
    try:
        observation, _ = env.reset(seed=started.seed)
        info: dict[str, Any] = {}
        for frame in frames_of(attempt, 0):
            np.testing.assert_array_equal(frame.state[STATE], observation["agent_pos"])
            np.testing.assert_array_equal(frame.state[ENV_STATE], observation["environment_state"])
            observation, _reward, _terminated, _truncated, info = env.step(frame.action)
        assert info["succeed"] is True
    finally:
        env.close()


def test_the_features_are_the_ones_the_plugin_gives_lerobot():
    """Our feature keys are where the plugin's config maps its observation (features_map), in its shapes and in
    its flattening order; 10 fps; 4-d action."""
    from lerobot_env_so101.configuration_so101 import SO101Env
    from lerobot_env_so101.policy import OBS_FIELD_NAMES

    config = SO101Env()
    info = get_task(TASK).info()
    plugin_shapes = {config.features_map[key]: feature.shape for key, feature in config.features.items()}
    assert {**info.state_shapes, "action": info.action_shape} == plugin_shapes
    assert info.fps == config.fps == 10 and info.cameras == ()
    assert (*info.feature_names[STATE], *info.feature_names[ENV_STATE]) == OBS_FIELD_NAMES


def test_image_obs_records_the_plugins_front_camera_instead_of_the_block_position():
    info = get_task(TASK).info({"image_obs": True})
    assert [(c.name, c.height, c.width) for c in info.cameras] == [("front", 128, 128)]
    assert set(info.state_shapes) == {STATE}
    env: Any = get_task(TASK).build({"image_obs": True})
    try:
        observation, _ = env.reset(seed=3)
        recorded = env.demo_record(observation)
        assert set(recorded.state) == {STATE} and recorded.images["front"].shape == (128, 128, 3)
        assert recorded.images["front"].std() > 5
    finally:
        env.close()


@pytest.mark.parametrize("options, named", [({"episode_length": 0}, "episode_length"),
                                            ({"image_obs": "yes"}, "image_obs"),
                                            ({"action_scale": 0.025}, "action_scale")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)


def test_a_missing_plugin_is_named(monkeypatch):
    from importlib import metadata

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)  # the installed-packages boundary
    with pytest.raises(TaskDefinitionError, match="lerobot-env-so101"):
        get_task(TASK).info()


# ------------------------------------------------------------------------------------------ as a user runs it
@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Two episodes generated and exported by the command line."""
    root = tmp_path_factory.mktemp("so101-plugin")
    done = run_cli("generate", "--task", TASK, "--episodes", str(EPISODES), "--store", str(root / "store"),
                   "--export", str(root / "so101-plugin"), timeout=600)
    assert done.returncode == 0, done.stderr
    return root / "so101-plugin"


def test_the_export_loads_in_lerobot_with_the_plugins_feature_keys(dataset):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    frames = LeRobotDataset("demoforge/so101-plugin", root=dataset)
    assert frames.meta.fps == 10 and frames.meta.total_episodes == EPISODES
    item = frames[0]
    assert tuple(item[STATE].shape) == (14,) and tuple(item[ENV_STATE].shape) == (3,)
    assert tuple(item["action"].shape) == (4,)
    assert frames.meta.features[STATE]["names"][-3:] == ["ee_x", "ee_y", "ee_z"]


def test_the_export_replays(dataset):
    """`demoforge replay` re-runs each episode in the plugin's env from its seed and recorded actions: same frames."""
    replayed = run_cli("replay", str(dataset), "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["summary"] == {"reproduced": EPISODES, "diverged": 0, "error": 0}


@pytest.mark.campaign  # LeRobot's train and eval loops: 30 s; the suite checks the export loads in LeRobotDataset
def test_lerobot_trains_on_the_export_and_evaluates_with_env_type_so101(dataset, tmp_path):
    """lerobot-train (a tiny ACT, one step) on the export, then lerobot-eval of the checkpoint in the plugin's env
    through `--env.type=so101` alone: the policy's inputs are the env's outputs by name. (A 20-step episode: the
    point is that the loop runs, not what one training step learned. lerobot-eval 0.6.1 counts any finished
    episode of this env as a success, as its info holds "succeed", not "is_success", so its reward is read.)"""
    from lerobot_loop import train_and_evaluate

    config = train_and_evaluate(tmp_path, dataset, ("--env.type=so101", "--env.random_block_position=true",
                                                    "--env.episode_length=20"))
    assert {k: v["shape"] for k, v in config["input_features"].items()} == {STATE: [14], ENV_STATE: [3]}
    assert config["output_features"]["action"]["shape"] == [4]
    info = json.loads((tmp_path / "eval" / "eval_info.json").read_text())
    (task,) = info["per_task"]
    assert task["task_group"] == "so101" and len(task["metrics"]["max_rewards"]) == 1
