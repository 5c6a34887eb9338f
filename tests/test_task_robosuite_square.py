"""The built-in "robosuite-square" task: robosuite 1.5.2's NutAssemblySquare with OSC_POSE delta control and a
reactive expert; its episodes put the nut on the peg in segments (nut, then peg), and a plain robosuite env (built
here, not through demoforge) driven by the recorded actions retraces the recorded end-effector and nut
trajectory. (Frames against robosuite's renders: tests/test_robosuite_tasks.py; 100 seeds: docs/tasks.md.)"""

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
from task_checks import check_segments_cover, ended, frames_of  # noqa: E402

TASK = "robosuite-square"
EPISODES = 2
SEGMENTS = (("reach", "nut"), ("grasp", "nut"), ("lift", "nut"), ("align", "peg"), ("insert", "peg"),
            ("release", "peg"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def square() -> Iterator[list[Any]]:
    env = get_task(TASK).build({"camera": "none"})
    try:
        yield list(run_episodes(env, task=TASK, episodes=EPISODES, job_seed=0, max_attempts=1))
    finally:
        env.close()


def test_the_expert_puts_the_nut_on_the_peg_in_segments(square):
    """Each episode succeeds at its one attempt, in the six segments in order, back to back from step 0 to the
    last frame, each with its target and instruction, every frame carrying its segment's id."""
    assert len(ended(square)) == EPISODES
    for end in ended(square):
        assert end.result.committable, (end.result.episode_index, end.result.failure_reason)
        check_segments_cover(end, square, tuple(n for n, _ in SEGMENTS), tuple(t for _, t in SEGMENTS))


def _plain_square(seed: int) -> Any:
    """NutAssemblySquare as robosuite's documentation builds it, with the arguments the task declares (not its
    code)."""
    import robosuite
    from robosuite.controllers import load_composite_controller_config

    return robosuite.make("NutAssemblySquare", robots="Panda", seed=seed, hard_reset=False, has_renderer=False,
                          has_offscreen_renderer=False, use_camera_obs=False, control_freq=20, horizon=500,
                          reward_shaping=False,
                          controller_configs=load_composite_controller_config(controller="BASIC", robot="Panda"))


def test_a_plain_robosuite_env_retraces_the_episode(square):
    """The recorded actions, stepped in a plain robosuite NutAssemblySquare seeded with the attempt's seed, give
    the recorded end-effector and nut poses at every step, and robosuite's own success at the end."""
    (started,) = [r for r in square if isinstance(r, AttemptStarted) and r.key.episode_index == 0]
    frames = frames_of(square, 0)
    env = _plain_square(started.seed)
    try:
        observation = env.reset()
        for frame in frames:
            state, objects = frame.state["observation.state"], frame.state["observation.environment_state"]
            np.testing.assert_allclose(state[:3], observation["robot0_eef_pos"], atol=1e-5)
            np.testing.assert_allclose(objects[7:14], np.concatenate([observation["SquareNut_pos"],
                                                                      observation["SquareNut_quat"]]), atol=1e-5)
            assert not env._check_success()
            observation, *_ = env.step(np.asarray(frame.action, dtype=np.float64))
        assert env._check_success()
    finally:
        env.close()


@pytest.mark.parametrize("options, named", [({"camera": "frontview"}, "camera"), ({"image_size": 8}, "image_size"),
                                            ({"max_steps": 501}, "max_steps"), ({"nut": "round"}, "nut"),
                                            ({"antialias": "yes"}, "antialias")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)
