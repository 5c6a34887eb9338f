"""The built-in "robosuite-can": robosuite 1.5.2's PickPlace with only the can (robomimic's Can) and a reactive
expert; its episode succeeds in named segments, and a plain robosuite env (built here, not through demoforge)
driven by the recorded actions retraces the recorded state, object state and success."""

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

TASK = "robosuite-can"
SEGMENTS = (("reach", "can"), ("grasp", "can"), ("lift", "can"), ("transport", "bin"), ("place", "bin"),
            ("release", "bin"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def can() -> Iterator[list[Any]]:
    env = get_task(TASK).build({"camera": "none"})
    try:
        yield list(run_episodes(env, task=TASK, episodes=1, job_seed=0, max_attempts=1))
    finally:
        env.close()


def test_the_expert_puts_the_can_in_its_bin_in_named_segments(can):
    """The segments are the expert's phases in order, with their targets and instructions, back to back from
    step 0 to the last frame, every frame carrying its segment's id."""
    (end,) = ended(can)
    assert end.result.committable, end.result.failure_reason
    check_segments_cover(end, can, tuple(n for n, _ in SEGMENTS), tuple(t for _, t in SEGMENTS))


def _plain_can(seed: int) -> Any:
    """robomimic's Can as robosuite's documentation builds it, with the arguments the task declares (not its
    code)."""
    import robosuite
    from robosuite.controllers import load_composite_controller_config

    return robosuite.make("PickPlace", single_object_mode=2, object_type="can", robots="Panda", seed=seed,
                          hard_reset=False, has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
                          control_freq=20, horizon=500, reward_shaping=False,
                          controller_configs=load_composite_controller_config(controller="BASIC", robot="Panda"))


def test_a_plain_robosuite_env_retraces_the_episode(can):
    """The recorded actions, stepped in a plain PickPlaceCan seeded with the attempt's seed, give the recorded
    robot state and the env's own object-state (robomimic's ``object``) at every step, and robosuite's success
    at the end."""
    (started,) = [r for r in can if isinstance(r, AttemptStarted)]
    check_plain_robosuite_retraces(_plain_can(started.seed), frames_of(can, 0))


def test_poses_name_the_can_and_its_compartment():
    """What ``demoforge multiply`` reads: the can's position (upright: a round can's yaw would only turn the
    moved grasp), the compartment's fixed pose, and which segment moves with which (the lift with the arm)."""
    env: Any = get_task(TASK).build({"camera": "none"})
    try:
        observation, _ = env.reset(seed=4)
        poses = env.demo_poses()
        found = poses.object_poses()
        np.testing.assert_allclose(found["can"].position, observation["Can_pos"], atol=1e-9)
        np.testing.assert_allclose(found["can"].quaternion, [1.0, 0.0, 0.0, 0.0])
        np.testing.assert_allclose(found["bin"].position[:2], [0.1975, 0.4025], atol=1e-9)
        assert [poses.reference(s, t) for s, t in SEGMENTS] == ["can", "can", None, "bin", "bin", "bin"]
    finally:
        env.close()


@pytest.mark.parametrize("options, named", [({"camera": "frontview"}, "camera"), ({"max_steps": 501}, "max_steps"),
                                            ({"object_type": "milk"}, "object_type")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)
