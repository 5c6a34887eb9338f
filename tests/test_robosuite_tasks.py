"""Every robosuite task, as robosuite itself runs it: its recorded camera frames equal the renders of a plain
robosuite env built from robosuite's documented arguments (here, not demoforge's code), and an episode made by
a worker process equals the one made in-process. The per-task files check experts, segments and trajectories;
LeRobot training on one robosuite export, then ``demoforge eval`` of the checkpoint, is in the campaign tier."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.registry import get_task, task_names  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from helpers import run_cli  # noqa: E402
from lerobot_loop import train  # noqa: E402
from task_checks import ended, frames_of, generate_with_a_worker_process  # noqa: E402

pytestmark = pytest.mark.slow

# robosuite.make's environment and arguments for each task, as robomimic's and robosuite's docs give them.
PLAIN = {
    "robosuite-lift": ("Lift", {}),
    "robosuite-can": ("PickPlace", {"single_object_mode": 2, "object_type": "can"}),
    "robosuite-square": ("NutAssemblySquare", {}),
    "robosuite-stack": ("Stack", {}),
}
TASKS = sorted(name for name in task_names() if name.startswith("robosuite-"))
CAMERAS = ("agentview", "robot0_eye_in_hand")
SIZE = 84
STEPS = 3  # expert steps whose frames are compared after the reset's


def test_every_robosuite_task_has_a_plain_reference():
    assert TASKS and set(TASKS) <= set(PLAIN), f"robosuite tasks without a plain env here: {set(TASKS) - set(PLAIN)}"


def _plain(task: str, seed: int, cameras: tuple[str, ...]) -> Any:
    import robosuite
    from robosuite.controllers import load_composite_controller_config

    env_name, extra = PLAIN[task]
    return robosuite.make(env_name, robots="Panda", seed=seed, hard_reset=False, has_renderer=False,
                          has_offscreen_renderer=bool(cameras), use_camera_obs=bool(cameras),
                          camera_names=list(cameras) or "agentview", camera_heights=SIZE, camera_widths=SIZE,
                          control_freq=20, reward_shaping=False,
                          controller_configs=load_composite_controller_config(controller="BASIC", robot="Panda"),
                          **extra)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if error == 0 else 10 * np.log10(255.0 ** 2 / error)


@pytest.mark.parametrize("task", TASKS)
def test_frames_equal_robosuites_own_renders(task):
    """Reset with a seed and a few expert steps: each recorded camera frame, flipped back to robosuite's
    bottom-up convention, is robosuite's own render of that camera in a plain env with the same seed."""
    seed = 7
    ours: Any = get_task(task).build({"image_size": SIZE})
    plain = _plain(task, seed, CAMERAS)
    try:
        observation, _ = ours.reset(seed=seed)
        expected = plain.reset()
        worst = float("inf")
        for step in range(STEPS + 1):
            recorded = ours.demo_record(observation)
            for camera in CAMERAS:
                worst = min(worst, psnr(recorded.images[camera][::-1], expected[f"{camera}_image"]))
            if step < STEPS:
                action, _phase = ours.expert.decide(observation)
                observation, *_ = ours.step(action)
                expected, *_ = plain.step(np.asarray(action, dtype=np.float64))
        assert worst >= 40.0, f"{task}: the worst frame's PSNR against robosuite's render is {worst:.1f} dB"
    finally:
        ours.close()
        plain.close()


@pytest.mark.parametrize("task", TASKS)
def test_a_process_worker_episode_equals_the_in_process_one(task, tmp_path: Path):
    """The same job, episode 0: made by a worker process and exported, its actions and states are the ones an
    in-process run records (robosuite's seeding travels with the attempt, not the process)."""
    env = get_task(task).build({"camera": "none"})
    try:
        records = list(run_episodes(env, task=task, episodes=1, job_seed=0, max_attempts=1))
    finally:
        env.close()
    assert [end.result.committable for end in ended(records)] == [True]
    frames = frames_of(records, 0)
    _store, dataset = generate_with_a_worker_process(tmp_path, "ds", ("--task", task, "--option", "camera=none",
                                                                      "--max-attempts", "1"))
    table = pq.read_table(next((dataset / "data").rglob("*.parquet"))).to_pydict()
    assert len(table["action"]) == len(frames)
    np.testing.assert_array_equal(np.array(table["action"], dtype=np.float32),
                                  np.stack([f.action for f in frames]).astype(np.float32))
    for key in ("observation.state", "observation.environment_state"):
        np.testing.assert_array_equal(np.array(table[key], dtype=np.float32),
                                      np.stack([f.state[key] for f in frames]).astype(np.float32))


@pytest.mark.campaign
def test_lerobot_trains_on_a_robosuite_export_and_demoforge_eval_runs_it(tmp_path: Path):
    """robomimic's Lift made here, trained by LeRobot's own loop; robosuite is not one of LeRobot's envs, so
    `demoforge eval` runs the checkpoint in the task (it reads robomimic's feature names back)."""
    store, dataset = tmp_path / "store", tmp_path / "lift"
    made = run_cli("generate", "--task", "robosuite-lift", "--episodes", "2", "--store", str(store),
                   "--export", str(dataset), "--codec", "h264", timeout=900)
    assert made.returncode == 0, made.stderr
    checkpoint = train(tmp_path, dataset)
    config = json.loads((checkpoint / "config.json").read_text())
    assert {"observation.images.agentview", "observation.images.robot0_eye_in_hand", "observation.state",
            "observation.environment_state"} <= set(config["input_features"])
    done = run_cli("eval", "--task", "robosuite-lift", "--option", "max_steps=40", "--driver", str(checkpoint),
                   "--episodes", "1", "--json", timeout=900)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["episodes"] == 1 and report["successes"] in (0, 1) and len(report["per_episode"]) == 1
