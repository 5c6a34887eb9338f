"""`demoforge convert --format robomimic-hdf5` and `--format rlds`. HDF5: the file read by robomimic 0.3.0's own code
(its dataset class, shape metadata and one step of its BC trainer), rows exactly the dataset's, camera and depth
frames as LeRobot decodes them, segments, success and seeds recovered (MimicGen's subtask signals parsed as MimicGen
parses them). RLDS: read back with TensorFlow Datasets' ``builder_from_directory(...).as_dataset()``, the same rows,
frames (PNG: lossless), segments as ``segment_id`` and ``language_instruction``. Both: bad input is one line, exit 2,
nothing written; a kill leaves only OUT.partial-*."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.lerobot.export import export_stores
from edit_helpers import copy_dataset, episode_frames, sidecar, tree
from helpers import demoforge_argv, kill_at_step, run_cli

pytestmark = pytest.mark.slow

CAMERA, DEPTH = "observation.images.front", "observation.images.front_depth"
OBS = {"state": "observation.state", "goal": "observation.goal", "front_image": CAMERA, "front_depth": DEPTH}


@pytest.fixture(scope="module")
def fetch(tmp_path_factory):
    """Two fetch-pick-place episodes (one cycle: 5 segments each) at 64x64 with a depth camera (h264), their
    v3.0 export and its robomimic HDF5 conversion."""
    root = tmp_path_factory.mktemp("convert_hdf5")
    store = root / "store"
    report = run_job(JobSpec(task="fetch-pick-place", episodes=2,
                             task_options={"image_size": 64, "antialias": False, "cycles": 1, "depth": True},
                             video=VideoSettings(codec="h264")), store)
    assert report.complete
    dataset = root / "dataset"
    export_stores([store], dataset)
    out = root / "fetch.hdf5"
    result = run_cli("convert", str(dataset), "--format", "robomimic-hdf5", "--out", str(out))
    assert result.returncode == 0, result.stderr
    frames = sum(r["length"] for r in sidecar(dataset))
    assert f"converted 2 episode(s), {frames} frames" in result.stdout
    assert not list(root.glob("fetch.hdf5.partial-*"))
    return {"dataset": dataset, "out": out, "frames": frames}


def _rows(dataset: Path) -> dict[str, list]:
    return pq.read_table(sorted(dataset.resolve().glob("data/*/*.parquet"))).to_pydict()


def _episode(rows: dict[str, list], column: str, index: int) -> np.ndarray:
    return np.asarray([v for v, e in zip(rows[column], rows["episode_index"]) if e == index])


def test_robomimic_trains_from_the_file_with_its_own_dataset_and_bc(fetch):
    """robomimic's training path, as its scripts/train.py runs it: the config names the keys, the file gives the
    shapes, ``load_data_for_training`` builds its ``SequenceDataset`` (filter key ``train``, everything cached,
    next_obs loaded), and BC with an image encoder takes a step on a batch."""
    import torch
    import robomimic.utils.file_utils as FileUtils
    import robomimic.utils.obs_utils as ObsUtils
    import robomimic.utils.train_utils as TrainUtils
    from robomimic.algo import algo_factory
    from robomimic.config import config_factory

    config = config_factory("bc")
    with config.values_unlocked():
        config.train.data = str(fetch["out"])
        config.train.hdf5_filter_key = "train"
        config.train.hdf5_cache_mode = "all"
        config.train.seq_length = 1
        config.train.hdf5_load_next_obs = True  # BC does not read next_obs; robomimic's offline RL algorithms do
        config.train.dataset_keys = ("actions", "rewards", "dones", "segment_ids")
        config.observation.modalities.obs.low_dim = ["state", "goal"]
        config.observation.modalities.obs.rgb = ["front_image"]
        config.observation.modalities.obs.depth = ["front_depth"]
        config.experiment.rollout.enabled = False
    ObsUtils.initialize_obs_utils_with_config(config)
    shapes = FileUtils.get_shape_metadata_from_dataset(config.train.data, all_obs_keys=config.all_obs_keys)
    assert shapes["ac_dim"] == 4 and shapes["all_shapes"]["front_image"] == [3, 64, 64]  # robomimic's CHW
    assert shapes["all_shapes"]["front_depth"] == [1, 64, 64] and shapes["use_images"]
    env = FileUtils.get_env_metadata_from_dataset(config.train.data)
    assert (env["env_name"], env["type"], env["env_kwargs"]["cycles"]) == ("fetch-pick-place", 2, 1)

    trainset, _ = TrainUtils.load_data_for_training(config, obs_keys=shapes["all_obs_keys"])
    assert trainset.n_demos == 2 and len(trainset) == fetch["frames"]
    rows = _rows(fetch["dataset"])  # in dataset order, as robomimic orders demo_0, demo_1
    items = [trainset[i] for i in range(len(trainset))]  # seq_length 1: each holds one step
    np.testing.assert_array_equal(np.concatenate([i["actions"] for i in items]), np.asarray(rows["action"]))
    np.testing.assert_array_equal(np.concatenate([i["obs"]["state"] for i in items]),
                                  np.asarray(rows["observation.state"]))
    np.testing.assert_array_equal(np.concatenate([i["segment_ids"] for i in items]),
                                  np.asarray(rows["annotation.segment_id"], np.float32))  # robomimic casts
    first = sidecar(fetch["dataset"])[0]["length"]  # next_obs: the following step's obs within an episode
    np.testing.assert_array_equal(np.concatenate([i["next_obs"]["state"] for i in items])[:first - 1],
                                  np.asarray(rows["observation.state"])[1:first])

    model = algo_factory(algo_name=config.algo_name, config=config, obs_key_shapes=shapes["all_shapes"],
                         ac_dim=shapes["ac_dim"], device=torch.device("cpu"))
    batch = next(iter(torch.utils.data.DataLoader(trainset, batch_size=8, shuffle=True)))
    prepared = model.postprocess_batch_for_training(model.process_batch_for_training(batch),
                                                    obs_normalization_stats=None)  # as TrainUtils.run_epoch
    info = model.train_on_batch(prepared, epoch=0, validate=False)
    assert np.isfinite(float(info["losses"]["action_loss"]))


def test_every_documented_key_shape_and_attribute(fetch):
    rows = _rows(fetch["dataset"])
    records = sidecar(fetch["dataset"])
    with h5py.File(fetch["out"], "r") as file:
        data = file["data"]
        assert sorted(data) == ["demo_0", "demo_1"]
        assert data.attrs["total"] == fetch["frames"] == sum(data[d].attrs["num_samples"] for d in data)
        provenance = json.loads(data.attrs["demoforge"])
        assert {k: v["feature"] for k, v in provenance["obs"].items()} == OBS
        for index, record in enumerate(records):
            demo = data[f"demo_{index}"]
            length = record["length"]
            assert demo.attrs["num_samples"] == length
            assert (demo["actions"].shape, demo["actions"].dtype) == ((length, 4), np.float32)
            np.testing.assert_array_equal(demo["actions"][()], _episode(rows, "action", index))
            np.testing.assert_array_equal(demo["rewards"][()], _episode(rows, "next.reward", index))
            assert demo["dones"][()].tolist() == [0] * (length - 1) + [1]
            assert sorted(demo["obs"]) == sorted(demo["next_obs"]) == sorted(OBS)
            for key, feature in OBS.items():
                obs, following = demo[f"obs/{key}"][()], demo[f"next_obs/{key}"][()]
                assert len(obs) == len(following) == length
                np.testing.assert_array_equal(following, np.concatenate([obs[1:], obs[-1:]]))
            assert (demo["obs/front_image"].shape, demo["obs/front_image"].dtype) == ((length, 64, 64, 3), np.uint8)
            assert (demo["obs/front_depth"].shape, demo["obs/front_depth"].dtype) == ((length, 64, 64, 1), np.float32)
            np.testing.assert_array_equal(demo["obs/goal"][()], _episode(rows, "observation.goal", index))
            for column in ("annotation.segment_start", "next.success", "annotation.terminated"):
                np.testing.assert_array_equal(demo[f"demoforge/{column}"][()].reshape(length),
                                              _episode(rows, column, index))
        assert [m.decode() for m in file["mask/train"][()]] == ["demo_0", "demo_1"]
        assert [m.decode() for m in file["mask/successful"][()]] == \
            [f"demo_{i}" for i, r in enumerate(records) if r["success"]]
        assert len(file["mask/failed"]) == sum(not r["success"] for r in records)


def test_frames_are_what_lerobot_decodes(fetch):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/fetch", root=fetch["dataset"].resolve(), video_backend="pyav",
                             depth_output_unit="m")
    with h5py.File(fetch["out"], "r") as file:
        images = np.concatenate([file[f"data/demo_{i}/obs/front_image"][()] for i in range(2)])
        depth = np.concatenate([file[f"data/demo_{i}/obs/front_depth"][()] for i in range(2)])
    assert len(images) == len(depth) == len(dataset)
    for index in range(0, len(dataset), 5):
        item = dataset[index]
        theirs = np.rint(item[CAMERA].numpy().transpose(1, 2, 0) * 255)  # LeRobot: float CHW in [0, 1]
        assert np.abs(theirs - images[index]).max() <= 1, index
        np.testing.assert_allclose(item[DEPTH].numpy().transpose(1, 2, 0), depth[index], rtol=1e-6, atol=1e-6)


def test_segments_success_and_seeds_come_back_and_mimicgen_finds_each_subtask_end(fetch):
    records = sidecar(fetch["dataset"])
    with h5py.File(fetch["out"], "r") as file:
        for index, record in enumerate(records):
            demo = file[f"data/demo_{index}"]
            assert (bool(demo.attrs["success"]), int(demo.attrs["seed"])) == (record["success"], record["seed"])
            assert demo.attrs["instruction"] == record["instruction"] and demo.attrs["job_task"] == "fetch-pick-place"
            assert json.loads(demo.attrs["demoforge_episode"]) == record
            segments = json.loads(demo.attrs["segments"])
            assert [(s["name"], s["start_step"], s["end_step"], s["success"]) for s in segments] == \
                [(s["name"], s["start_step"], s["end_step"], s["success"]) for s in record["segments"]]
            assert len(segments) == 5
            ids = demo["segment_ids"][()]
            for n, segment in enumerate(segments):
                assert set(ids[segment["start_step"]:segment["end_step"]].tolist()) == {n}
                # mimicgen/utils/file_utils.py parse_source_dataset (Isaac Lab Mimic's DataGenInfoPool is the same)
                signal = demo[f"datagen_info/subtask_term_signals/{segment['name']}"][()]
                end_ind = int((signal[1:] - signal[:-1]).nonzero()[0][0]) + 1
                assert end_ind + 1 == segment["end_step"], segment["name"]


def test_a_split_part_is_its_own_filter_key_and_a_dataset_without_sidecar_converts_with_what_it_has(fetch, tmp_path):
    result = run_cli("edit", str(fetch["dataset"]), "--split", "train=0.5,val=0.5", "--seed", "0", "--out-root",
                     str(tmp_path / "parts"))
    assert result.returncode == 0, result.stderr
    assert run_cli("convert", str(tmp_path / "parts" / "val"), "--format", "robomimic-hdf5", "--out",
                   str(tmp_path / "val.hdf5")).returncode == 0
    with h5py.File(tmp_path / "val.hdf5", "r") as file:
        assert sorted(file["mask"]) == ["failed", "successful", "val"] and len(file["mask/val"]) == 1

    # a LeRobot dataset demoforge did not publish (no marker, no sidecar): the rows, frames and segment column
    foreign = tmp_path / "foreign"
    shutil.copytree(fetch["dataset"].resolve(), foreign)
    for name in ("demoforge.json", "demoforge_episodes.jsonl"):
        (foreign / "meta" / name).unlink()
    result = run_cli("convert", str(foreign), "--format", "robomimic-hdf5", "--out", str(tmp_path / "foreign.hdf5"))
    assert result.returncode == 0, result.stderr
    assert "without demoforge's sidecar: no segments, success or seeds" in result.stdout
    with h5py.File(tmp_path / "foreign.hdf5", "r") as file, h5py.File(fetch["out"], "r") as ours:
        assert sorted(file["mask"]) == ["train"]
        for demo in ("demo_0", "demo_1"):
            for key in ("actions", "obs/state", "obs/front_image", "segment_ids"):
                np.testing.assert_array_equal(file[f"data/{demo}/{key}"][()], ours[f"data/{demo}/{key}"][()])
            assert "success" not in file[f"data/{demo}"].attrs and "datagen_info" not in file[f"data/{demo}"]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(fetch, tmp_path):
    dataset = copy_dataset(fetch["dataset"], tmp_path / "copy")
    exists = tmp_path / "there.hdf5"
    exists.write_text("keep me")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a dataset")
    no_action = copy_dataset(fetch["dataset"], tmp_path / "no_action")
    info_path = no_action.resolve() / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    del info["features"]["action"]
    info_path.write_text(json.dumps(info))
    cases = [
        ((str(dataset), str(exists)), "exists: a conversion is written to a new path"),
        ((str(dataset), str(dataset / "meta" / "x.hdf5")), "a conversion is written apart from its dataset"),
        ((str(tmp_path / "plain"), str(tmp_path / "p.hdf5")), "is not a LeRobot v3.0 dataset"),
        ((str(no_action), str(tmp_path / "n.hdf5")), "has no numeric 'action' feature"),
    ]
    before = tree(tmp_path)
    for (source, out), fragment in cases:
        result = run_cli("convert", source, "--format", "robomimic-hdf5", "--out", out)
        assert result.returncode == 2, (out, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("demoforge convert: error:") and fragment in lines[0], lines
        assert tree(tmp_path) == before, out


@pytest.mark.parametrize("fmt, name", [("robomimic-hdf5", "killed.hdf5"), ("rlds", "killed")])
def test_a_kill_mid_conversion_leaves_only_a_partial_output(fetch, tmp_path, fmt, name):
    out = tmp_path / name
    kill_at_step(demoforge_argv("convert", str(fetch["dataset"]), "--format", fmt, "--out", str(out)),
                 "after_videos", tmp_path / "hung")
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "hung")
    assert len(left) == 1 and left[0].startswith(f"{name}.partial-"), left
    assert not out.exists()


@pytest.fixture(scope="module")
def rlds(fetch):
    out = fetch["out"].parent / "fetch_rlds"
    result = run_cli("convert", str(fetch["dataset"]), "--format", "rlds", "--out", str(out), fresh=True)
    assert result.returncode == 0, result.stderr
    assert f"converted 2 episode(s), {fetch['frames']} frames" in result.stdout
    assert not result.stderr.strip(), result.stderr  # TensorFlow's start-up lines are kept quiet
    return out


#: Reads an RLDS folder with TensorFlow Datasets in a process of its own (TensorFlow crashes a process that has
#: rendered with Mesa, as this one has) and saves every step's values, by episode, to an npz.
TFDS_READER = """
import json, sys
import numpy as np
import tensorflow_datasets as tfds
builder = tfds.builder_from_directory(sys.argv[1])
out = {"examples": np.int64(builder.info.splits["train"].num_examples)}
for i, episode in enumerate(builder.as_dataset(split="train")):
    steps = list(episode["steps"].as_numpy_iterator())
    for key in ("action", "reward", "segment_id", "is_first", "is_last", "is_terminal", "language_instruction"):
        out[f"{i}/{key}"] = np.stack([s[key] for s in steps])
    for key in steps[0]["observation"]:
        out[f"{i}/observation/{key}"] = np.stack([s["observation"][key] for s in steps])
    out[f"{i}/metadata"] = np.array(json.dumps({k: v.numpy().item() if v.dtype.name != "string" else
                                                v.numpy().decode() for k, v in episode["episode_metadata"].items()}))
np.savez(sys.argv[2], **out)
"""


def test_rlds_reads_back_with_tfds_as_the_same_rows_frames_and_segments(fetch, rlds, tmp_path):
    read = subprocess.run([sys.executable, "-c", TFDS_READER, str(rlds / "fetch_rlds" / "1.0.0"),
                           str(tmp_path / "read.npz")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert read.returncode == 0, read.stderr
    back = np.load(tmp_path / "read.npz")
    assert int(back["examples"]) == 2
    rows = _rows(fetch["dataset"])
    records = sidecar(fetch["dataset"])
    with h5py.File(fetch["out"], "r") as file:
        depth = [file[f"data/demo_{i}/obs/front_depth"][()] for i in range(2)]
    for index, record in enumerate(records):
        length = record["length"]
        np.testing.assert_array_equal(back[f"{index}/action"], _episode(rows, "action", index))
        np.testing.assert_array_equal(back[f"{index}/observation/state"], _episode(rows, "observation.state", index))
        np.testing.assert_array_equal(back[f"{index}/reward"], _episode(rows, "next.reward", index))
        np.testing.assert_array_equal(back[f"{index}/segment_id"], _episode(rows, "annotation.segment_id", index))
        frames = episode_frames(fetch["dataset"], index, CAMERA)  # the export's video, decoded with PyAV
        np.testing.assert_array_equal(back[f"{index}/observation/front_image"], frames)  # PNG: lossless
        np.testing.assert_array_equal(back[f"{index}/observation/front_depth"], depth[index])
        flags = np.stack([back[f"{index}/is_first"], back[f"{index}/is_last"], back[f"{index}/is_terminal"]], 1)
        assert flags.tolist() == [[True, False, False]] + [[False, False, False]] * (length - 2) + \
            [[False, True, True]]
        said = back[f"{index}/language_instruction"]
        for segment in record["segments"]:
            assert {s.decode() for s in said[segment["start_step"]:segment["end_step"]]} == {segment["instruction"]}
        metadata = json.loads(str(back[f"{index}/metadata"]))
        assert (metadata["success"], metadata["seed"], metadata["episode_index"]) == \
            (record["success"], record["seed"], index)
        assert json.loads(metadata["demoforge_episode"]) == record
        assert [s["name"] for s in json.loads(metadata["segments"])] == [s["name"] for s in record["segments"]]


def test_rlds_in_a_process_that_rendered_is_refused_not_crashed(fetch, tmp_path):
    """This test process has rendered with MuJoCo's EGL (the fixture's job): importing TensorFlow now would
    crash it; the conversion says so instead, and writes nothing."""
    from demoforge.storage.convert import ConvertError, convert

    assert "OpenGL.EGL" in sys.modules and "tensorflow" not in sys.modules
    with pytest.raises(ConvertError, match="crashes a process that has rendered with Mesa"):
        convert(fetch["dataset"], "rlds", tmp_path / "r")
    assert not list(tmp_path.iterdir())


def test_rlds_without_tensorflow_datasets_is_refused_before_anything_is_written(fetch, tmp_path):
    shim = tmp_path / "shim" / "tensorflow_datasets"  # what an environment without the rlds extra imports
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named tensorflow_datasets')\n")
    before = tree(tmp_path)
    result = run_cli("convert", str(fetch["dataset"]), "--format", "rlds", "--out", str(tmp_path / "r"), fresh=True,
                     PYTHONPATH=f"{shim.parent}{os.pathsep}{Path(__file__).parent}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--format rlds needs TensorFlow Datasets" in lines[0] and "demoforge[rlds]" in lines[0]
    assert tree(tmp_path) == before
