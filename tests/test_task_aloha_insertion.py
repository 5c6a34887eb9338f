"""The built-in "aloha-insertion" task on the real gym-aloha simulator: the expert's episodes in-process, then
as a user runs it: a worker process records what the thread executor records, the export replays in another
process, the viewer lists its segments, and LeRobot trains on the export and evaluates the checkpoint
in ``AlohaInsertion-v0``."""

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
from demoforge.stages.records import AttemptEnded, Frame  # noqa: E402
from demoforge.storage.episode_source import open_episode_source  # noqa: E402
from helpers import run_cli  # noqa: E402
from lerobot_loop import train_and_evaluate  # noqa: E402

TASK = "aloha-insertion"
OPTIONS = {"image_height": 48, "image_width": 64}  # unequal sides catch a swapped height/width
EPISODES = 2
SEGMENTS = ("reach", "descend", "grasp", "lift_to_meet", "insert")
SMALL = ("--task", TASK, "--option", "image_height=48", "--option", "image_width=64", "--codec", "h264")

pytestmark = pytest.mark.slow


def frames_of(records: list[Any], episode: int) -> list[Frame]:
    return [r for r in records if isinstance(r, Frame) and r.key.episode_index == episode]


def ended(records: list[Any]) -> list[AttemptEnded]:
    return [r for r in records if isinstance(r, AttemptEnded)]


@pytest.fixture(scope="module")
def insertion() -> Iterator[tuple[Any, list[Any]]]:
    env = get_task(TASK).build(OPTIONS)
    env.physics.model.vis.quality.offsamples = 0  # multisampling: most of the CPU render cost, edges only
    try:
        yield env, list(run_episodes(env, task=TASK, episodes=EPISODES, job_seed=0, max_attempts=1))
    finally:
        env.close()


def test_the_expert_inserts_the_peg_and_the_episode_ends_there(insertion):
    """Every episode ends at the first frame with gym-aloha's reward 4 (peg touches the pin), as
    AlohaInsertion-v0 does, and only there."""
    _env, records = insertion
    results = [end.result for end in ended(records)]
    assert [r.committable for r in results] == [True] * EPISODES, [(r.episode_index, r.failure_reason)
                                                                     for r in results]
    for result in results:
        frames = frames_of(records, result.episode_index)
        rewards = [f.reward for f in frames]
        assert rewards[-1] == 4.0 and 4.0 not in rewards[:-1]
        assert frames[-1].annotations.terminated and not any(f.annotations.terminated for f in frames[:-1])
        assert 2.0 in rewards  # both objects held off the table before they met (gym-aloha's reward 2)


def test_segments_are_named_contiguous_and_cover_the_episode(insertion):
    _env, records = insertion
    for end in ended(records):
        result = end.result
        assert tuple(s.name for s in result.segments) == SEGMENTS
        assert result.segments[0].start_step == 0
        for before, after in zip(result.segments, result.segments[1:]):
            assert before.end_step == after.start_step and before.length > 0
        assert result.segments[-1].end_step == result.length == end.frames
        assert all(s.success and s.target == "peg+socket" and s.instruction for s in result.segments)
        frames = frames_of(records, result.episode_index)
        assert [f.annotations.segment_id for f in frames] == [
            s.segment_id for s in result.segments for _ in range(s.length)]


def test_task_info_matches_the_frames(insertion):
    _env, records = insertion
    info = get_task(TASK).info(OPTIONS)
    frame = frames_of(records, 0)[0]
    assert [(c.name, c.height, c.width) for c in info.cameras] == [("top", 48, 64)]
    assert frame.images["top"].shape == (48, 64, 3) and frame.images["top"].dtype == np.uint8
    assert {k: v.shape for k, v in frame.state.items()} == dict(info.state_shapes) == {"observation.state": (14,)}
    assert frame.action.shape == info.action_shape == (14,)
    assert info.segment_names == SEGMENTS and info.fps == 50 and info.robot_type == "aloha"


def test_with_the_eval_envs_rendering_frames_are_what_lerobots_aloha_env_gives_a_policy() -> None:
    """`lerobot-eval --env.type=aloha` (AlohaInsertion-v0, its default) renders `top` at 480x640 with shadows:
    asked for that rendering, our frame and state equal it pixel for pixel."""
    import gym_aloha  # noqa: F401 - registers gym_aloha/AlohaInsertion-v0
    import gymnasium as gym

    reference = gym.make("gym_aloha/AlohaInsertion-v0", obs_type="pixels_agent_pos")
    ours = get_task(TASK).build({"image_height": 480, "image_width": 640, "shadows": True})
    try:
        expected, _ = reference.reset(seed=7)
        observation, _ = ours.reset(seed=7)
        recorded = ours.demo_record(observation)
        assert np.array_equal(recorded.images["top"], expected["pixels"]["top"])
        np.testing.assert_allclose(recorded.state["observation.state"], expected["agent_pos"], atol=1e-6)
    finally:
        reference.close()
        ours.close()


def test_every_randomization_axis_applies_and_the_expert_still_inserts(insertion):
    """Lighting, colours, camera and the peg's and socket's physics vary per seed; the plan reads the scene, so
    the same episode index still succeeds, and looks different."""
    _env, records = insertion
    randomized = get_task(TASK).build({**OPTIONS, "randomize": "all"})
    try:
        again = list(run_episodes(randomized, task=TASK, episodes=1, job_seed=0, max_attempts=1))
    finally:
        randomized.close()
    assert [end.result.committable for end in ended(again)] == [True]
    plain, varied = frames_of(records, 0)[0].images["top"], frames_of(again, 0)[0].images["top"]
    assert np.abs(plain.astype(int) - varied.astype(int)).mean() > 5


@pytest.mark.parametrize("options, named", [({"image_height": 16}, "image_height"), ({"shadows": 1}, "shadows"),
                                            ({"peg_size": 2}, "peg_size")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)


# ------------------------------------------------------------------------------------------ as a user runs it
@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Path]:
    """One episode generated by a worker process (``--executor process``) and exported."""
    root = tmp_path_factory.mktemp("insertion")
    store, dataset = root / "store", root / "aloha-insertion"
    done = run_cli("generate", *SMALL, "--episodes", "1", "--store", str(store), "--export", str(dataset),
                   "--executor", "process", "--workers", "1", timeout=600)
    assert done.returncode == 0, done.stderr
    return store, dataset


def test_a_process_worker_records_what_the_thread_executor_records_and_it_replays(job, insertion):
    """The episode a worker process committed has the actions and states, exactly, of the same episode run by the
    executor a thread worker runs (this module's in-process episodes: same options and job seed); the export
    replays in another process."""
    store, dataset = job
    source = open_episode_source(store)
    try:
        (episode,) = [source.load(ref) for ref in source.episodes()]
    finally:
        source.close()
    frames = frames_of(insertion[1], 0)
    assert len(frames) == len(episode.action) > 0
    np.testing.assert_array_equal(episode.action, np.stack([f.action for f in frames]))
    np.testing.assert_array_equal(episode.state["observation.state"],
                                  np.stack([f.state["observation.state"] for f in frames]))
    # The export (a store's replay of the same ALOHA machinery is test_replay.py's, on transfer-cube)
    replayed = run_cli("replay", str(dataset), "--json", "--images")
    report = json.loads(replayed.stdout)
    assert replayed.returncode == 0, (replayed.stderr, report)
    assert report["kind"] == "dataset" and report["summary"] == {"reproduced": 1, "diverged": 0, "error": 0}
    assert report["settings"]["tolerances"] == {TASK: {"atol": 1e-5, "rtol": 1e-6}}


def test_the_viewer_lists_each_episode_with_its_segments(job):
    from demoforge.storage.viewer.source import open_source

    _store, dataset = job
    source = open_source(dataset)
    try:
        entries = source.entries()
        view = source.episode(entries[0].key)
    finally:
        source.close()
    assert len(entries) == 1 and entries[0].outcome == "success" and entries[0].segments == SEGMENTS
    assert [v.camera for v in view.videos] == ["top"] and view.videos[0].to_s > view.videos[0].from_s


def test_lerobot_trains_on_the_export_and_evaluates_in_alohainsertion(job, tmp_path):
    _store, dataset = job
    config = train_and_evaluate(tmp_path, dataset, ("--env.type=aloha", "--env.task=AlohaInsertion-v0",
                                                    "--env.episode_length=20"))
    assert set(config["input_features"]) == {"observation.images.top", "observation.state"}
    assert config["output_features"]["action"]["shape"] == [14]
