"""The built-in "fetch-pick-place" task on the real FetchPickAndPlace-v4 simulator.

One module-scoped run of 10 episodes (small images) feeds the success, segment and determinism checks, so the
whole file stays well under a minute on two CPU cores.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from collections import defaultdict  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from demoforge.pipeline.tasks.registry import TaskOptionError, get_task  # noqa: E402
from demoforge.stages.contract import EpisodeResult, Segment  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import AttemptEnded, Frame  # noqa: E402

TASK = "fetch-pick-place"
PHASES = ["reach", "descend", "grasp", "carry", "release"]
SMALL = {"cycles": 3, "image_size": 64, "antialias": False}  # success does not depend on how it is drawn


@dataclass
class Run:
    frames: dict[int, list[Frame]] = field(default_factory=lambda: defaultdict(list))
    results: dict[int, EpisodeResult] = field(default_factory=dict)


def run_task(options: dict, episodes: int) -> Run:
    """Run episodes 0..episodes-1 of job seed 0, one attempt each, and keep every frame and result."""
    env = get_task(TASK).build(options)
    run = Run()
    try:
        for record in run_episodes(env, task=TASK, episodes=episodes, job_seed=0, max_attempts=1):
            if isinstance(record, Frame):
                run.frames[record.key.episode_index].append(record)
            elif isinstance(record, AttemptEnded):
                run.results[record.key.episode_index] = record.result
    finally:
        env.close()
    return run


@pytest.fixture(scope="module")
def ten_episodes() -> Run:
    return run_task(SMALL, episodes=10)


@pytest.mark.slow
def test_most_seeds_commit(ten_episodes: Run) -> None:
    results = ten_episodes.results
    assert sorted(results) == list(range(10))
    failed = {i: r.failure_reason for i, r in results.items() if not r.committable}
    assert len(failed) <= 1, failed


@pytest.mark.slow
def test_segments_follow_the_cycles_and_plan_from_the_measured_cube(ten_episodes: Run) -> None:
    info = get_task(TASK).info(SMALL)
    for index, result in ten_episodes.results.items():
        if not result.committable:
            continue
        frames = ten_episodes.frames[index]
        names = [s.name for s in result.segments]
        assert names == [f"{p}_{i}" for i in range(3) for p in PHASES] == list(info.segment_names)
        reaches = [s for s in result.segments if s.name.startswith("reach_")]
        starts = []
        for cycle, reach in enumerate(reaches):
            assert reach.metadata["cycle"] == cycle
            first = frames[reach.start_step]
            # The planner measured the cube in the sim when the cycle began: it is the recorded cube position.
            measured = np.array(reach.metadata["object_start"])
            np.testing.assert_allclose(measured, first.state["observation.state"][3:6], atol=1e-3)
            # The cycle's goal is the env's goal from the cycle's first frame on.
            np.testing.assert_allclose(reach.metadata["goal"], first.state["observation.goal"], atol=1e-5)
            starts.append(measured)
        for a, b in zip(starts, starts[1:]):
            assert np.linalg.norm(a[:2] - b[:2]) > 0.05, "each cycle should start from where the last left the cube"
        goals = [np.array(r.metadata["goal"]) for r in reaches]
        assert all(np.linalg.norm(a - b) > 0.05 for a, b in zip(goals, goals[1:]))
        for seg in result.segments:
            assert seg.target == "object0" and seg.instruction and seg.success


def _manual_plan(env, seed: int) -> Iterator[tuple[Segment, int]]:
    """Drive the task's plan by hand, yielding (segment, steps it ran) after each segment."""
    env.reset(seed=seed)
    for segment in env.create_demo_segments():
        steps = 0
        for action in segment.actions:
            env.step(action)
            steps += 1
        yield segment, steps


@pytest.mark.slow
def test_next_cycle_plans_from_where_the_cube_really_is() -> None:
    """Move the cube by hand between cycles: the next cycle must plan from (and succeed at) its new pose."""
    env: Any = get_task(TASK).build({"cycles": 2, "image_size": 32})
    try:
        fetch: Any = env.unwrapped
        plan = _manual_plan(env, seed=7)
        for _ in PHASES:
            next(plan)
        placed = env._object()
        corners = [np.array([x, y]) for x in (1.22, 1.46) for y in (0.63, 0.87)]
        spot = max(corners, key=lambda c: np.linalg.norm(c - placed[:2]))
        qpos = fetch._utils.get_joint_qpos(fetch.model, fetch.data, "object0:joint").copy()
        qpos[:3] = [spot[0], spot[1], fetch.height_offset]
        qpos[3:] = [1.0, 0.0, 0.0, 0.0]
        fetch._utils.set_joint_qpos(fetch.model, fetch.data, "object0:joint", qpos)
        fetch.data.qvel[:] = 0.0
        import mujoco

        mujoco.mj_forward(fetch.model, fetch.data)
        reach, _ = next(plan)
        assert reach.name == "reach_1"
        np.testing.assert_allclose(reach.metadata["object_start"][:2], spot, atol=2e-3)
        rest = list(plan)
        assert [s.name for s, _ in rest] == [f"{p}_1" for p in PHASES[1:]]
        assert np.linalg.norm(env._object() - fetch.goal) < fetch.distance_threshold
    finally:
        env.close()


@pytest.mark.slow
def test_same_seed_same_actions_and_images(ten_episodes: Run) -> None:
    again = run_task(SMALL, episodes=1)
    first, second = ten_episodes.frames[0], again.frames[0]
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.action, b.action)
        np.testing.assert_array_equal(a.images["front"], b.images["front"])
        np.testing.assert_array_equal(a.state["observation.state"], b.state["observation.state"])


@pytest.mark.slow
def test_task_info_matches_real_frames_at_default_size() -> None:
    entry = get_task(TASK)
    info = entry.info()
    env: Any = entry.build()
    try:
        obs, _ = env.reset(seed=0)
        recorded = [env.demo_record(obs)]
        for _ in range(3):
            obs, *_ = env.step(env.demo_hold_action())
            recorded.append(env.demo_record(obs))
        assert env.action_space.shape == info.action_shape == (4,)
    finally:
        env.close()
    (camera,) = info.cameras
    assert (camera.name, camera.height, camera.width) == ("front", 224, 224)
    for rec in recorded:
        assert {k: v.shape for k, v in rec.state.items()} == dict(info.state_shapes)
        assert all(v.dtype == np.float32 for v in rec.state.values())
        image = rec.images["front"]
        assert image.shape == (224, 224, 3) and image.dtype == np.uint8
        assert image.std() > 10  # a real rendering, not a blank frame
    assert info.fps == 25 and info.robot_type == "fetch"
    assert len(info.segment_names) == 15 and info.instruction


def test_options_are_range_checked() -> None:
    entry = get_task(TASK)
    for bad in ({"cycles": 0}, {"cycles": 21}, {"image_size": 31}, {"image_size": 1025}):
        with pytest.raises(TaskOptionError):
            entry.info(bad)
    info = entry.info({"cycles": 1, "image_size": 96})
    assert info.segment_names == tuple(f"{p}_0" for p in PHASES)
    assert info.cameras[0].height == info.cameras[0].width == 96


@pytest.mark.slow
def test_depth_option_renders_metres_from_the_front_camera() -> None:
    """``depth=true`` adds camera ``front_depth``: float32 metres of the same view and size, the same for the
    same seed; the cube on the table is nearer than the floor behind it, the far plane is beyond everything."""
    entry = get_task(TASK)
    options = {"cycles": 1, "image_size": 64, "depth": True}
    rgb, depth = entry.info(options).cameras
    assert (depth.name, depth.kind, depth.shape) == ("front_depth", "depth", (64, 64))
    assert rgb.kind == "rgb" and "depth" not in entry.info({"cycles": 1}).options  # off: fingerprint unchanged

    def first_frames() -> list[np.ndarray]:
        env: Any = entry.build(options)
        try:
            obs, _ = env.reset(seed=3)
            frames = [env.demo_record(obs).images["front_depth"]]
            obs, *_ = env.step(env.demo_hold_action())
            frames.append(env.demo_record(obs).images["front_depth"])
        finally:
            env.close()
        return frames

    first, again = first_frames(), first_frames()
    for a, b in zip(first, again):
        assert a.shape == (64, 64) and a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    scene = first[0][first[0] < 5.0]
    assert scene.size > 64 * 64 / 2 and 0.3 < scene.min() and 0.5 < float(np.median(scene)) < 2.0  # table ~1 m away


def test_two_env_threads_render_at_once_without_crashing_and_commit_what_one_does(tmp_path) -> None:
    """Two thread workers rendered through two EGL contexts at once and MuJoCo crashed the process (SIGSEGV);
    rendering is serialised per process now, and the episodes are those of a one-worker run."""
    from demoforge.storage.store import open_store
    from helpers import run_cli

    def identity(store):
        with open_store(store) as view:
            return [(r.episode_index, r.seed, r.frames, r.content_hash) for r in view.committed()]

    args = ("generate", "--task", "fetch-pick-place", "--episodes", "6", "--option", "cycles=1",
            "--option", "antialias=false", "--codec", "h264", "--max-attempts", "1")
    for workers in ("2", "1"):
        done = run_cli(*args, "--workers", workers, "--store", str(tmp_path / workers))
        assert done.returncode == 0, (workers, done.returncode, done.stderr[-2000:])
    assert identity(tmp_path / "2") == identity(tmp_path / "1")
