"""The built-in "robosuite-stack": robosuite 1.5.2's Stack (MimicGen's Stack) and a reactive expert; its episodes
succeed in named segments aimed first at cubeA then at cubeB, and a plain robosuite env (built here, not through
demoforge) driven by the recorded actions retraces the recorded state, object state and success."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.registry import TaskOptionError, get_task  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import AttemptStarted  # noqa: E402
from task_checks import check_plain_robosuite_retraces, check_segments_cover, ended, frames_of  # noqa: E402

TASK = "robosuite-stack"
EPISODES = 2
SEGMENTS = (("reach", "cubeA"), ("grasp", "cubeA"), ("lift", "cubeA"), ("align", "cubeB"), ("place", "cubeB"),
            ("release", "cubeB"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack() -> Iterator[list[Any]]:
    env = get_task(TASK).build({"camera": "none"})
    try:
        yield list(run_episodes(env, task=TASK, episodes=EPISODES, job_seed=0, max_attempts=1))
    finally:
        env.close()


def test_the_expert_stacks_in_named_segments_on_cube_a_then_cube_b(stack):
    """Each episode's segments are the expert's phases in order, with their targets and instructions, back to
    back from step 0 to the last frame, every frame carrying its segment's id."""
    assert len(ended(stack)) == EPISODES
    for end in ended(stack):
        assert end.result.committable, (end.result.episode_index, end.result.failure_reason)
        check_segments_cover(end, stack, tuple(n for n, _ in SEGMENTS), tuple(t for _, t in SEGMENTS))


def _plain_stack(seed: int) -> Any:
    """Stack as robosuite's documentation builds it, with the arguments the task declares (not its code)."""
    import robosuite
    from robosuite.controllers import load_composite_controller_config

    return robosuite.make("Stack", robots="Panda", seed=seed, hard_reset=False, has_renderer=False,
                          has_offscreen_renderer=False, use_camera_obs=False, control_freq=20, horizon=400,
                          reward_shaping=False,
                          controller_configs=load_composite_controller_config(controller="BASIC", robot="Panda"))


def test_a_plain_robosuite_env_retraces_the_episode(stack):
    """The recorded actions, stepped in a plain Stack seeded with the attempt's seed, give the recorded robot
    state and the env's own object-state at every step, and robosuite's success at the end."""
    (started,) = [r for r in stack if isinstance(r, AttemptStarted) and r.key.episode_index == 1]
    check_plain_robosuite_retraces(_plain_stack(started.seed), frames_of(stack, 1))


def test_poses_name_both_cubes_in_the_world():
    """What ``demoforge multiply`` reads: each cube's position, upright; cubeA's yaw within a quarter turn (a
    cube turned by one is the same cube), cubeB's left out (cubeA goes on top whatever it is); and which object
    each segment moves with (the grasp with cubeA, the placing with cubeB, the lift with the arm)."""
    from demoforge.pipeline.tasks.robosuite_env import yaw

    env: Any = get_task(TASK).build({"camera": "none"})
    try:
        observation, _ = env.reset(seed=4)
        poses = env.demo_poses()
        found = poses.object_poses()
        for cube in ("cubeA", "cubeB"):
            np.testing.assert_allclose(found[cube].position, observation[f"{cube}_pos"], atol=1e-9)
        _, x, y, _ = found["cubeA"].quaternion
        assert abs(x) < 1e-12 and abs(y) < 1e-12
        turned = yaw(found["cubeA"].quaternion[[1, 2, 3, 0]])
        assert abs(turned) <= np.pi / 4 and np.isclose(np.cos(4 * turned), np.cos(4 * yaw(observation["cubeA_quat"])))
        np.testing.assert_allclose(found["cubeB"].quaternion, [1.0, 0.0, 0.0, 0.0])
        assert [poses.reference(s, t) for s, t in SEGMENTS] == ["cubeA", "cubeA", None, "cubeB", "cubeB", "cubeB"]
    finally:
        env.close()


@pytest.mark.parametrize("options, named", [({"camera": "sideview"}, "camera"), ({"max_steps": 401}, "max_steps"),
                                            ({"image_size": 8}, "image_size")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)
