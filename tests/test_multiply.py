"""`demoforge multiply`: the planning math on its own (a rigid motion of the object moves the generated trajectory
by exactly that motion), the extracted source's file, and the command end to end on real tasks: generated
episodes replay, carry their provenance into the export, resume as one job, and bad sources are refused
with one line, exit 2 and nothing written."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from demoforge.pipeline.multiply_plan import (
    ExtractedEpisode,
    SourceFileError,
    ExtractedSegment,
    ExtractedSource,
    apply_transform,
    interpolate,
    load_source,
    matrix_pose,
    plan_segment,
    pose_matrix,
    pose_row,
)
from demoforge.stages.task_protocol import Pose
from demoforge.storage.episode_source import open_episode_source
from helpers import REPO, attempts_now, cli_env, run_cli
from lerobot_loop import train

FETCH = ("--option", "cycles=1", "--option", "image_size=64", "--option", "antialias=false", "--codec", "h264")
REACH = ("--task", "metaworld-reach-v3", "--option", "camera=none", "--codec", "h264")  # no renderer: fast
SO101 = ("--option", "image_height=32", "--option", "image_width=32", "--option", "antialias=false", "--codec", "h264")


# ------------------------------------------------------------------------------------------- the planning math
def _rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    axis = axis / np.linalg.norm(axis)
    return np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * axis])


def _source(rng: np.random.Generator, frames: int = 12) -> ExtractedSource:
    """One episode of random poses: two segments, the first moving with 'cube', the second with nothing."""
    def poses(n: int) -> np.ndarray:
        return np.stack([pose_row(Pose(rng.normal(size=3), rng.normal(size=4))) for _ in range(n)])

    segments = (ExtractedSegment(0, "grasp", "cube", None, 0, 7, "cube"),
                ExtractedSegment(1, "lift", None, None, 7, frames, None))
    episode = ExtractedEpisode(number=3, label="episode 3", seed=11, segments=segments, eef=poses(frames + 1),
                            commanded=poses(frames), gripper=rng.uniform(-1, 1, frames),
                            objects=poses(frames + 1)[:, None, :])
    return ExtractedSource(task="t", source="/s", object_names=("cube",), episodes=(episode,))


def _same_pose(a: Pose, b: Pose) -> bool:
    return bool(np.allclose(pose_matrix(a), pose_matrix(b), atol=1e-9))


def test_an_object_moved_rigidly_moves_the_generated_trajectory_by_exactly_that_motion():
    rng = np.random.default_rng(0)
    source = _source(rng)
    episode = source.episodes[0]
    motion = pose_matrix(Pose(np.array([0.3, -0.2, 0.05]), _rotation(np.array([0.2, -0.4, 1.0]), 0.7)))
    cube_then = episode.object_pose(0, 0)
    planned = plan_segment(source, episode, 0, apply_transform(motion, cube_then))
    assert np.allclose(planned.transform, motion, atol=1e-9)
    expected = [apply_transform(motion, Pose(r[:3], r[3:])) for r in episode.commanded[0:7]]
    assert len(planned.targets) == 7 and all(_same_pose(a, b) for a, b in zip(planned.targets, expected))
    assert _same_pose(planned.start, apply_transform(motion, episode.eef_pose(0)))
    assert planned.grippers == tuple(episode.gripper[0:7])
    # The source object itself: the transform takes its pose at the segment's start to the pose it has now.
    assert _same_pose(apply_transform(planned.transform, cube_then), apply_transform(motion, cube_then))
    # A segment without a reference starts where the end effector is: relative to the previous segment's end.
    here = Pose(np.array([1.0, 2.0, 3.0]), _rotation(np.array([1.0, 0.0, 0.0]), 0.3))
    lift = plan_segment(source, episode, 1, here)
    assert _same_pose(lift.start, here)
    relative = pose_matrix(here) @ np.linalg.inv(pose_matrix(episode.eef_pose(7)))
    assert all(_same_pose(t, apply_transform(relative, Pose(r[:3], r[3:])))
               for t, r in zip(lift.targets, episode.commanded[7:12]))
    provenance = json.loads(json.dumps(planned.provenance("random", 5), allow_nan=False))
    assert provenance["source_episode"] == 3 and provenance["source_frames"] == [0, 7]
    assert np.allclose(provenance["transform"], motion, atol=1e-8)


def test_pose_math_round_trips_and_interpolates():
    rng = np.random.default_rng(1)
    for _ in range(50):
        pose = Pose(rng.normal(size=3), rng.normal(size=4))
        assert _same_pose(matrix_pose(pose_matrix(pose)), pose)
    a, b = Pose(np.zeros(3)), Pose(np.array([1.0, 2.0, 3.0]), _rotation(np.array([0.0, 0.0, 1.0]), np.pi / 2))
    assert _same_pose(interpolate(a, b, 0.0), a) and _same_pose(interpolate(a, b, 1.0), b)
    half = interpolate(a, b, 0.5)
    assert np.allclose(half.position, [0.5, 1, 1.5]) and _same_pose(
        Pose(np.zeros(3), half.quaternion), Pose(np.zeros(3), _rotation(np.array([0.0, 0.0, 1.0]), np.pi / 4)))


def test_the_source_file_is_content_hashed_and_read_without_pickle(tmp_path):
    source = _source(np.random.default_rng(2))
    path = source.save(tmp_path)
    digest = source.content_hash()
    assert path.name == f"source-{digest[:16]}.npz" and source.save(tmp_path) == path
    loaded = load_source(path, digest)
    assert loaded.content_hash() == digest and loaded.sequence == ("grasp", "lift")
    assert np.array_equal(loaded.episodes[0].commanded, source.episodes[0].commanded)
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["commanded", "eef", "gripper", "meta", "objects"]
    with pytest.raises(SourceFileError, match="changed or replaced"):
        load_source(path, "0" * 64)
    path.write_bytes(b"not a zip")
    with pytest.raises(SourceFileError, match="cannot read"):
        load_source(path, digest)


# ---------------------------------------------------------------------------------------- the command

def _generate(store, *args, episodes=2):
    result = run_cli("generate", *args, "--episodes", str(episodes), "--store", str(store))
    assert result.returncode == 0, result.stderr
    return store


@pytest.fixture(scope="module")
def fetch_source(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("multiply") / "fetch", "--task", "fetch-pick-place", *FETCH)


def _catalog(store):
    return [(row.episode_index, row.seed, row.record) for row in attempts_now(store, ("committed", "exported"))]


@pytest.mark.slow
def test_multiplied_fetch_episodes_replay_keep_provenance_through_export_and_merge_and_train(fetch_source, tmp_path):
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    result = run_cli("multiply", str(fetch_source), *FETCH, "--episodes", "2", "--seed", "5", "--max-attempts", "10",
                     "--store", str(store), "--export", str(dataset))
    assert result.returncode == 0, result.stderr
    assert "generation:" in result.stdout and "attempts per success" in result.stdout
    assert len(list((store / "multiply").glob("source-*.npz"))) == 1
    replayed = run_cli("replay", str(dataset))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    rows = [json.loads(line) for line in (dataset / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        names = [s["name"] for s in row["segments"]]
        assert names == ["reach_0", "descend_0", "grasp_0", "carry_0", "release_0"]
        for segment in row["segments"]:
            origin = segment["metadata"]["multiply"]
            assert origin["source_episode"] in (0, 1) and origin["source_segment_name"] == segment["name"]
            assert origin["reference"] == ("goal" if segment["name"] in ("carry_0", "release_0") else "object0")
            assert np.asarray(origin["transform"]).shape == (4, 4) and origin["interpolation_steps"] >= 5
            assert "placement" in segment["metadata"]  # the task's own planner ran beside it (its validators)
    # The same command again resumes the same job (nothing to do); another strategy is another job: refused.
    again = run_cli("multiply", str(fetch_source), *FETCH, "--episodes", "2", "--seed", "5", "--store", str(store))
    assert again.returncode == 0 and "(0 this run" in again.stdout, again.stderr
    other = run_cli("multiply", str(fetch_source), *FETCH, "--episodes", "2", "--seed", "5", "--strategy", "nearest",
                    "--store", str(store))
    assert other.returncode == 2 and "demoforge multiply: error:" in other.stderr, other.stderr
    # The provenance survives a merge with the sources' own export, and LeRobot trains on the merged dataset.
    sources = tmp_path / "sources"
    shutil.copytree(fetch_source, sources / "store")  # the module's source store stays unexported
    assert run_cli("export", "--store", str(sources / "store"), "--out", str(sources / "ds")).returncode == 0
    merged = tmp_path / "merged"
    done = run_cli("merge", str(sources / "ds"), str(dataset), "--out", str(merged))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (merged / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    origins = [[seg["metadata"].get("multiply") for seg in row["segments"]] for row in rows]
    assert sum(all(o is not None for o in episode) for episode in origins) == 2  # the multiplied ones, whole
    assert sum(all(o is None for o in episode) for episode in origins) == 2  # the sources, none
    config = json.loads((train(tmp_path, merged) / "config.json").read_text())
    assert config["output_features"]["action"]["shape"] == [4]


@pytest.mark.slow
def test_a_resumed_job_on_the_process_executor_makes_the_episodes_of_an_uninterrupted_one(fetch_source, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    common = (str(fetch_source), *FETCH, "--seed", "3", "--max-attempts", "10", "--strategy", "nearest")
    assert run_cli("multiply", *common, "--episodes", "2", "--store", str(whole)).returncode == 0
    assert run_cli("multiply", *common, "--episodes", "1", "--store", str(parts)).returncode != 2
    resumed = run_cli("multiply", *common, "--episodes", "2", "--store", str(parts), "--executor", "process")
    assert resumed.returncode == 0, resumed.stderr
    a, b = _catalog(whole), _catalog(parts)
    assert [(i, s) for i, s, _ in a] == [(i, s) for i, s, _ in b]
    assert [[seg["metadata"] for seg in r["segments"]] for _, _, r in a] == \
        [[seg["metadata"] for seg in r["segments"]] for _, _, r in b]


@pytest.mark.slow
def test_a_metaworld_source_is_multiplied_and_a_diverging_episode_is_skipped_by_name(tmp_path):
    source = _generate(tmp_path / "reach", *REACH, episodes=3)
    dataset = tmp_path / "reach-ds"
    assert run_cli("export", "--store", str(source), "--out", str(dataset)).returncode == 0
    sidecar = dataset / "meta" / "demoforge_episodes.jsonl"
    rows = [json.loads(line) for line in sidecar.read_text().splitlines()]
    rows[0]["seed"] += 1  # episode 0 no longer replays from its seed
    sidecar.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = tmp_path / "store"
    result = run_cli("multiply", str(dataset), *REACH[2:], "--episodes", "2", "--seed", "9", "--max-attempts", "10",
                     "--store", str(store))
    assert result.returncode == 0, result.stderr
    assert "warning: skipped source dataset episode 0: does not replay" in result.stderr
    assert {s["metadata"]["multiply"]["source_episode"] for _, _, r in _catalog(store) for s in r["segments"]} \
        <= {1, 2}
    assert run_cli("replay", str(store)).returncode == 0
    # One episode left, then none: refused, nothing written.
    for broken, fragment in ((1, "only 1 episode of"), (2, "no episode of")):
        rows[broken]["seed"] += 1
        sidecar.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / f"none{broken}"
        refused = run_cli("multiply", str(dataset), *REACH[2:], "--episodes", "2", "--store", str(out))
        assert refused.returncode == 2 and fragment in refused.stderr and not out.exists(), refused.stderr


@pytest.mark.slow
def test_sources_that_cannot_be_multiplied_are_refused_with_one_line_and_nothing_written(fetch_source, tmp_path):
    toy = _generate(tmp_path / "toy", "--task", "toy-point", "--codec", "h264", "--option", "steps=6")
    one = _generate(tmp_path / "one", "--task", "toy-cube", "--codec", "h264", episodes=1)
    empty = _generate(tmp_path / "empty", "--task", "fetch-pick-place", *FETCH, episodes=0)
    button = _generate(tmp_path / "button", "--task", "metaworld-button-press-topdown-v3", "--option", "camera=none",
                       "--codec", "h264", episodes=1)
    flat = tmp_path / "flat-ds"
    assert run_cli("export", "--store", str(fetch_source), "--out", str(flat)).returncode == 0
    sidecar = flat / "meta" / "demoforge_episodes.jsonl"
    sidecar.write_text("".join(json.dumps({**json.loads(line), "segments": []}) + "\n"
                               for line in sidecar.read_text().splitlines()))
    cases = [((str(fetch_source), "--task", "metaworld-reach-v3"), "holds episodes of task 'fetch-pick-place', not"),
             ((str(toy),), "names a target object"),
             ((str(empty),), "has no episodes to multiply"),
             ((str(one),), "holds 1 episode: multiply needs at least 2 source demonstrations"),
             ((str(button),), "cannot be multiplied: it does not report the poses"),
             ((str(flat),), "records no segments"),
             ((str(tmp_path / "missing"),), "does not exist"),
             ((str(fetch_source), "--interpolation", "-1"), "--interpolation must be in 0..")]
    for index, (args, fragment) in enumerate(cases):
        store = tmp_path / f"out{index}"
        result = run_cli("multiply", *args, "--episodes", "1", "--store", str(store))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("demoforge multiply: error:"), \
            (args, result.stderr)
        assert fragment in lines[0], (fragment, lines[0])
        assert not store.exists(), args


# ------------------------------------------------------------------------------- a joint-space arm: the SO-101
def test_the_so101_pose_conversion_is_inverse_kinematics_that_inverts_its_forward_kinematics():
    """mink's inverse kinematics from the arm's current angles finds the joint targets whose fingertip pose was
    asked for (a nearby pose of the arm's reach: one solution), and a far pose is approached by a bounded step."""
    import mujoco

    from demoforge.pipeline.tasks.so101_pick_place import So101PickPlaceEnv, So101Poses

    scene = So101PickPlaceEnv(32, 32, False, False)  # no reset: nothing is rendered
    poses = So101Poses(scene)
    rng = np.random.default_rng(0)
    low, high = scene.units.low[:5] + 0.05, scene.units.high[:5] - 0.05  # inside the joint limits

    for _ in range(10):
        here = np.clip(scene.home[:5] + rng.uniform(-0.3, 0.3, 5), low, high)
        scene.data.qpos[:5] = here
        mujoco.mj_forward(scene.model, scene.data)
        action = scene.units.to_lerobot(np.array([*np.clip(here + rng.uniform(-0.02, 0.02, 5), low, high), 0.0]))
        action[5] = 30.0
        pose = poses.commanded_pose(action)
        assert np.all(np.abs(pose.position - scene.tip()) < So101Poses.MAX_STEP)  # within one step's reach
        back = poses.action_toward(pose, 30.0)
        assert np.allclose(back[:5], action[:5], atol=1e-3) and back[5] == 30.0, (back, action)
        assert _same_pose_within(poses.commanded_pose(back), pose, 1e-6)
    far = Pose(scene.tip() + np.array([0.1, -0.1, 0.05]), pose.quaternion)
    step = poses.commanded_pose(poses.action_toward(far, 0.0)).position - scene.tip()
    # (the orientation asked for is met as nearly as five joints allow at the new position: within a millimetre)
    assert np.all(np.abs(step - So101Poses.MAX_STEP * np.array([1.0, -1.0, 1.0])) < 1e-3), step
    scene.close()


def _same_pose_within(a: Pose, b: Pose, atol: float) -> bool:
    return bool(np.allclose(pose_matrix(a), pose_matrix(b), atol=atol))


@pytest.mark.slow
def test_a_multiplied_so101_episode_replays_and_records_its_provenance(tmp_path):
    source = _generate(tmp_path / "so101", "--task", "so101-pick-place", *SO101)
    store = tmp_path / "store"
    result = run_cli("multiply", str(source), *SO101, "--episodes", "1", "--seed", "7", "--max-attempts", "5",
                     "--store", str(store))
    assert result.returncode == 0, result.stderr
    replayed = run_cli("replay", str(store))
    assert replayed.returncode == 0 and "1 reproduced" in replayed.stdout, replayed.stdout + replayed.stderr
    (_, _, record), = _catalog(store)
    assert [s["name"] for s in record["segments"]] == ["reach", "descend", "grasp", "lift", "carry", "place",
                                                       "release", "retreat"]
    for segment in record["segments"]:
        origin = segment["metadata"]["multiply"]
        assert origin["reference"] == ("target" if segment["name"] in ("carry", "place", "release", "retreat")
                                       else "cube")
        assert origin["source_episode"] in (0, 1) and origin["source_segment_name"] == segment["name"]


# --------------------------------------------------------------------------------------- a plugin task
def _states(path):
    """Each episode's recorded state (by its number) and record, read from a store or dataset."""
    source = open_episode_source(path)
    try:
        return {ref.number: (source.load(ref).state["observation.state"].astype(np.float64), source.header(ref)[0])
                for ref in source.episodes()}
    finally:
        source.close()


def _cube(state: np.ndarray, frame: int) -> Pose:
    """toy-cube's cube pose in its recorded state (position, then yaw)."""
    yaw = state[frame, 6]
    return Pose(state[frame, 3:6], np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]))


@pytest.mark.slow
def test_a_plugin_task_with_the_capability_is_multiplied_like_a_built_in_one(tmp_path):
    """tests/toy_tasks.py's toy-cube (a plugin, rebuilt by name in worker processes): its generated episodes
    replay, and each segment's recorded transform takes the source's cube pose at the source segment's start to
    the cube's pose at the generated segment's start."""
    source = _generate(tmp_path / "toy", "--task", "toy-cube", "--codec", "h264")
    store = tmp_path / "store"
    result = run_cli("multiply", str(source), "--episodes", "3", "--seed", "9", "--max-attempts", "10",
                     "--executor", "process", "--store", str(store))
    assert result.returncode == 0, result.stderr
    assert run_cli("replay", str(store)).returncode == 0
    sources, generated = _states(source), _states(store)
    assert len(generated) == 3
    for state, record in generated.values():
        assert [s["name"] for s in record["segments"]] == ["reach", "descend", "grasp", "lift"]
        assert state[-1, 7] == 1.0  # the cube is held at the end (success lifted it)
        for segment in record["segments"]:
            origin = segment["metadata"]["multiply"]
            source_state, _ = sources[origin["source_episode"]]
            then, now = _cube(source_state, origin["source_frames"][0]), _cube(state, segment["start_step"])
            moved = np.asarray(origin["transform"]) @ pose_matrix(then)
            assert origin["reference"] == "cube" and np.allclose(moved, pose_matrix(now), atol=1e-5)


# ------------------------------------------------------------------------------------ Recorder-made sources
@pytest.mark.slow
def test_a_recorder_made_source_is_multiplied_in_the_task_its_loop_drove(tmp_path):
    """docs/multiply.md's Recorder loop (the Meta-World expert with a shaky hand, through the env directly)
    records the poses; `multiply --task` makes replayable episodes from it. Without --task, or without the pose
    features, it is refused."""
    block, = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "multiply.md").read_text(), flags=re.S)
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=cli_env(HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "saved episode 2" in done.stdout, done.stderr[-2000:]
    recording = tmp_path / "runs" / "pick-place-teleop"
    rows = [json.loads(line) for line in (recording / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(s["target"] == "puck" for r in rows for s in r["segments"])
    no_task = run_cli("multiply", str(recording), "--episodes", "1", "--store", str(tmp_path / "none"))
    assert no_task.returncode == 2 and "name the task its loop ran over with --task" in no_task.stderr
    assert not (tmp_path / "none").exists()
    store = tmp_path / "store"
    result = run_cli("multiply", str(recording), "--task", "metaworld-pick-place-v3", "--option", "camera=none",
                     "--codec", "h264", "--episodes", "2", "--seed", "4", "--max-attempts", "10", "--store", str(store))
    assert result.returncode == 0, result.stderr
    assert run_cli("replay", str(store)).returncode == 0
    for _, _, record in _catalog(store):
        assert [s["name"] for s in record["segments"]] == [s["name"] for s in rows[0]["segments"]]
        for segment in record["segments"]:
            origin = segment["metadata"]["multiply"]
            assert origin["source_label"].startswith("dataset episode") and origin["source_seed"] == 0


def test_a_recording_without_poses_or_with_a_bad_target_is_refused(tmp_path):
    from demoforge import Recorder
    from demoforge.pipeline.recorder import FrameError

    features = {"observation.state": {"dtype": "float32", "shape": (8,), "names": None},
                "action": {"dtype": "float32", "shape": (4,), "names": None}}
    root = tmp_path / "bare"
    with Recorder.create(root, fps=10, features=features, codec="h264") as recorder:
        frame = {"observation.state": np.zeros(8, np.float32), "action": np.zeros(4, np.float32), "task": "lift"}
        with pytest.raises(FrameError, match="target=''"):
            recorder.add_frame(frame, segment="reach", target="")
        for _ in range(2):
            for _ in range(3):
                recorder.add_frame(frame, segment="reach", target="cube")
            recorder.save_episode()
    rows = [json.loads(line) for line in (root / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    assert [[(s["name"], s["target"]) for s in r["segments"]] for r in rows] == [[("reach", "cube")]] * 2
    out = tmp_path / "out"
    refused = run_cli("multiply", str(root), "--task", "toy-cube", "--episodes", "1", "--store", str(out))
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and not out.exists(), refused.stderr
    assert "records no observation.eef_pose, observation.commanded_pose, observation.object_poses.<name>" in lines[0]
