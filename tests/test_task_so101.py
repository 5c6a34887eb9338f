"""The built-in "so101-pick-place" task: MuJoCo Menagerie's SO-101 (from the so101-nexus package) with a
reactive expert, recorded with the features LeRobot's own SO-101 follower gives `lerobot-record`; then as a user
runs it: a worker process records what the thread executor records, it replays, the viewer lists it,
`lerobot-train` trains on the export and `demoforge eval` runs the checkpoint in the task."""

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
from helpers import run_cli  # noqa: E402
from task_checks import (  # noqa: E402
    check_randomized_episode,
    check_segments_cover,
    check_stored_episode_is,
    ended,
    frames_of,
    generate_with_a_worker_process,
)
from lerobot_loop import train  # noqa: E402

TASK = "so101-pick-place"
OPTIONS = {"image_height": 48, "image_width": 64, "antialias": False}
EPISODES = 2
SEGMENTS = ("reach", "descend", "grasp", "lift", "carry", "place", "release", "retreat")
# Multisampled as by default: the job's export is replayed with --images, and at 48x64 in h264 aliased edges
# compress below replay's 23 dB (22.4 dB on one frame of 71); the in-process episodes above need no such check.
SMALL = ("--task", TASK, "--option", "image_height=48", "--option", "image_width=64", "--codec", "h264")
MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def so101() -> Iterator[tuple[Any, list[Any]]]:
    env = get_task(TASK).build(OPTIONS)
    try:
        yield env, list(run_episodes(env, task=TASK, episodes=EPISODES, job_seed=0, max_attempts=1))
    finally:
        env.close()


def test_the_expert_places_the_cube_through_every_segment_in_order(so101):
    _env, records = so101
    for end in ended(records):
        result = end.result
        assert result.committable, (result.episode_index, result.failure_reason)
        # Reactive phases: each segment ends where the expert's phase changed; in these seeds, once each.
        check_segments_cover(end, records, SEGMENTS, "cube")
        frames = frames_of(records, result.episode_index)
        assert frames[-1].annotations.terminated and frames[-1].reward == 1.0


def test_actions_and_states_are_lerobot_so101_units_within_the_joint_limits(so101):
    """Body joints in degrees within the model's ranges, the gripper in 0..100; the state follows the action."""
    env, records = so101
    model = env.get_wrapper_attr("physics_model")
    limits = np.rad2deg(np.array([model.jnt_range[model.joint(m).id] for m in MOTORS[:5]]))
    frames = [f for end in ended(records) for f in frames_of(records, end.result.episode_index)]
    actions = np.stack([f.action for f in frames])
    states = np.stack([f.state["observation.state"] for f in frames])
    # Commands within the limits; positions within them up to MuJoCo's soft limit constraint (a hundredth of a
    # degree measured where the expert holds the wrist at its limit)
    for values, slack in ((actions, 1e-3), (states, 0.1)):
        assert values.dtype == np.float32 and values.shape[1] == 6
        assert (values[:, :5] >= limits[:, 0] - slack).all() and (values[:, :5] <= limits[:, 1] + slack).all()
        assert (values[:, 5] >= -slack).all() and (values[:, 5] <= 100 + slack).all()
    assert actions[:, 5].max() > 50 and actions[:, 5].min() == 0  # opened for the cube, closed on it
    assert np.abs(actions[:, 0]).max() > 10  # the shoulder panned toward the cube and the target
    lag = np.abs(actions[:-1, :5] - states[1:, :5]).mean()
    assert lag < 5.0, lag  # degrees: the servos track the commanded joints


def test_the_cameras_are_front_and_wrist_and_see_different_things(so101):
    _env, records = so101
    frame = frames_of(records, 0)[0]
    assert set(frame.images) == {"front", "wrist"}
    for image in frame.images.values():
        assert image.shape == (48, 64, 3) and image.dtype == np.uint8 and image.std() > 5
    assert np.abs(frame.images["front"].astype(int) - frame.images["wrist"].astype(int)).mean() > 10


def test_every_randomization_axis_applies_and_the_expert_still_places(so101):
    check_randomized_episode(TASK, OPTIONS, so101[1], "front")


@pytest.mark.parametrize("options, named", [({"image_height": 16}, "image_height"), ({"max_steps": 0}, "max_steps"),
                                            ({"cube": "red"}, "cube")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(TaskOptionError, match=named):
        get_task(TASK).info(options)


def test_a_missing_model_package_is_named(monkeypatch):
    from importlib import metadata

    from demoforge.pipeline.tasks import so101_pick_place

    def missing(name: str) -> Any:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(so101_pick_place.metadata, "distribution", missing)  # the installed-packages boundary
    with pytest.raises(TaskOptionError, match="so101-nexus"):
        so101_pick_place.model_path()


# ------------------------------------------------------------------------------------------ as a user runs it
@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Path]:
    """One episode generated by a worker process (``--executor process``) and exported."""
    return generate_with_a_worker_process(tmp_path_factory.mktemp("so101"), "so101", SMALL)


def test_the_export_has_the_features_lerobot_records_for_an_so101_follower(job, tmp_path):
    """The features `lerobot-record` builds from LeRobot's own SO101Follower (its motors, two cameras of this
    size): same keys, dtypes, shapes and names; and the robot type it records."""
    import pathlib

    from lerobot.cameras.opencv import OpenCVCameraConfig
    from lerobot.robots.so_follower import SO101Follower, SO101FollowerConfig
    from lerobot.utils.feature_utils import hw_to_dataset_features

    cameras = {name: OpenCVCameraConfig(index_or_path=0, width=64, height=48, fps=30) for name in ("front", "wrist")}
    robot = SO101Follower(SO101FollowerConfig(port="unused", cameras=cameras,
                                              calibration_dir=pathlib.Path(tmp_path)))  # never connected
    theirs = {**hw_to_dataset_features(robot.action_features, "action"),
              **hw_to_dataset_features(robot.observation_features, "observation")}
    info = json.loads((job[1] / "meta" / "info.json").read_text())
    ours = info["features"]
    for key, feature in theirs.items():
        assert ours[key]["dtype"] == feature["dtype"] and tuple(ours[key]["shape"]) == tuple(feature["shape"]), key
        assert ours[key]["names"] == feature["names"], key
    assert info["robot_type"] == robot.name and info["fps"] == 30


def test_a_process_worker_records_what_the_thread_executor_records_and_it_replays(job, so101):
    """The episode a worker process committed has the actions and states, exactly, of the same episode run by the
    executor a thread worker runs (this module's in-process episodes: same job seed, same options but
    ``antialias``, which changes edge pixels and no action or state); the
    export replays in another process (a store's replay is test_replay.py's)."""
    store, dataset = job
    check_stored_episode_is(store, frames_of(so101[1], 0))
    replayed = run_cli("replay", str(dataset), "--json", "--images")
    report = json.loads(replayed.stdout)
    assert replayed.returncode == 0, (replayed.stderr, report)
    assert report["kind"] == "dataset" and report["summary"] == {"reproduced": 1, "diverged": 0, "error": 0}


def test_the_viewer_lists_the_episode_with_its_segments_and_both_cameras(job):
    from demoforge.pipeline.viewer.source import open_source

    source = open_source(job[1])
    try:
        entries = source.entries()
        view = source.episode(entries[0].key)
    finally:
        source.close()
    assert len(entries) == 1 and entries[0].outcome == "success" and entries[0].segments == SEGMENTS
    assert sorted(v.camera for v in view.videos) == ["front", "wrist"]


@pytest.mark.campaign
def test_lerobot_trains_on_the_export_and_demoforge_eval_runs_the_checkpoint(job, tmp_path):
    """LeRobot's envs do not simulate this scene: `demoforge eval` runs the trained checkpoint in the task."""
    checkpoint = train(tmp_path, job[1])
    config = json.loads((checkpoint / "config.json").read_text())
    assert set(config["input_features"]) == {"observation.images.front", "observation.images.wrist",
                                             "observation.state"}
    done = run_cli("eval", "--task", TASK, "--option", "image_height=48", "--option", "image_width=64",
                   "--option", "max_steps=40", "--driver", str(checkpoint), "--episodes", "1", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["episodes"] == 1 and report["successes"] in (0, 1) and len(report["per_episode"]) == 1


def test_the_fingerprint_carries_the_feature_names_and_refuses_bad_ones():
    """Named features and the robot type live in the store's fingerprint (absent for tasks without them, so their
    stores keep their fingerprints); a tampered entry is a typed error naming the field."""
    from demoforge.pipeline.job import JobSpec
    from demoforge.storage.schema import Fingerprint, FingerprintError

    fingerprint = JobSpec(task=TASK, episodes=1, task_options=OPTIONS).fingerprint()
    raw = fingerprint.to_dict()
    assert raw["feature_names"]["action"] == [f"{m}.pos" for m in MOTORS] and raw["robot_type"] == "so_follower"
    assert Fingerprint.from_dict(raw) == fingerprint
    plain = JobSpec(task="aloha-insertion", episodes=1, task_options={"image_height": 48}).fingerprint().to_dict()
    assert "feature_names" not in plain and "robot_type" not in plain
    for bad in ({**raw["feature_names"], "action": ["a"] * 6}, {"observation.images.front": ["x"]}):
        with pytest.raises(FingerprintError, match="feature_names"):
            Fingerprint.from_dict({**raw, "feature_names": bad})


def test_the_init_axis_defaults_to_what_the_task_allows():
    """A task whose limit is below the shared default of a range starts from its limit; beyond is refused."""
    so101, fetch = get_task(TASK), get_task("fetch-pick-place")
    assert so101.resolve_options({"randomize": "init"})["randomize.init.scale"] == 1.1
    assert fetch.resolve_options({"randomize": "init"})["randomize.init.scale"] == 1.3  # the shared default
    with pytest.raises(TaskOptionError, match=r"randomize.init.scale' must be in 1..1.1"):
        so101.resolve_options({"randomize": "init", "randomize.init.scale": 1.2})
