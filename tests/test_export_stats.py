"""Per-episode statistics: computed while an episode is recorded, exactly as LeRobot 0.6.1's writer computes
them (checked against its own ``compute_episode_stats`` on the same frames), committed under the episode's
content hash (``verify`` catches a tampered record), read at export without decoding video; episodes staged
before statistics were recorded (formats 1 and 2) get them computed from their staged video at export."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import toy_tasks  # noqa: F401  (registers toy-point)
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.pipeline.tasks.registry import get_task
from demoforge.stages.executor import run_episodes
from demoforge.stages.records import Frame
from demoforge.storage import lerobot_stats
from demoforge.storage.lerobot.export import export_store
from demoforge.storage.lerobot.files import _arrow_table, data_schema, episode_frames
from demoforge.storage.sampled_frames import SampledFrames
from demoforge.storage.schema import CameraSpec
from demoforge.storage.store import open_store
from demoforge.storage.staging import STATS_ATTRIBUTE, StagedEpisode
from demoforge.storage.video import decode_frames
from helpers import REPO, run_cli

# 130 frames: LeRobot samples 100 of them; 320 px: it strides every second row and column.
OPTIONS = {"steps": 130, "size": 320}
EPISODES = 2
CAMERA = "observation.images.cam"
OLD_STORES = {1: REPO / "tests" / "data" / "store-format1.tar.gz", 2: REPO / "tests" / "data" / "store-format2.tar.gz"}


@dataclass
class Recorded:
    store: Path
    dataset: Path
    frames: dict[int, list[np.ndarray]]  # the images the camera recorded, by episode


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    base = tmp_path_factory.mktemp("stats")
    store, dataset = base / "store", base / "dataset"
    assert run_job(JobSpec(task="toy-point", episodes=EPISODES, task_options=OPTIONS,
                           video=VideoSettings(codec="h264")), store).committed_total == EPISODES
    export_store(store, dataset)
    env = get_task("toy-point").build(OPTIONS)  # deterministic: the same frames the job recorded
    frames: dict[int, list[np.ndarray]] = {i: [] for i in range(EPISODES)}
    for record in run_episodes(env, task="toy-point", episodes=EPISODES, max_attempts=1):
        if isinstance(record, Frame):
            frames[record.key.episode_index].append(record.images["cam"])
    return Recorded(store, dataset, frames)


def exported_episode_stats(dataset: Path) -> list[dict[str, dict[str, np.ndarray]]]:
    import pyarrow.parquet as pq

    rows = []
    for path in sorted(dataset.resolve().glob("meta/episodes/*/*.parquet")):
        rows += pq.read_table(path).to_pylist()
    out = []
    for row in sorted(rows, key=lambda r: r["episode_index"]):
        stats: dict[str, dict[str, np.ndarray]] = {}
        for column, value in row.items():
            if column.startswith("stats/"):
                _, feature, stat = column.split("/")
                stats.setdefault(feature, {})[stat] = np.asarray(value)
        out.append(stats)
    return out


def lerobot_episode_stats(dataset: Path, episode: int, images: list[np.ndarray], folder: Path) -> dict:
    """LeRobot's own ``compute_episode_stats`` as its writer calls it: the episode's frames written as image
    files by its image writer, the numeric features as the arrays it stacks from its episode buffer."""
    import pandas as pd
    from lerobot.datasets.compute_stats import compute_episode_stats
    from lerobot.datasets.image_writer import write_image

    info = json.loads((dataset / "meta" / "info.json").read_text())
    features = info["features"]
    data = pd.concat([pd.read_parquet(p) for p in sorted(dataset.resolve().glob("data/*/*.parquet"))])
    rows = data[data["episode_index"] == episode]
    buffer: dict = {}
    for key, ft in features.items():
        if ft["dtype"] in ("video", "image", "language", "string"):
            continue
        column = rows[key].to_numpy()
        buffer[key] = np.stack(column) if ft["shape"] != [1] else column.astype(ft["dtype"])
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        path = folder / f"frame-{i:06d}.png"
        write_image(image, path)
        paths.append(str(path))
    buffer[CAMERA] = paths
    return compute_episode_stats(buffer, features)


def assert_stats_equal(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for feature, stats in theirs.items():
        assert set(ours[feature]) == set(stats), feature
        for name, value in stats.items():
            np.testing.assert_allclose(np.asarray(ours[feature][name], dtype=np.float64).reshape(np.shape(value)),
                                       np.asarray(value, dtype=np.float64), rtol=1e-6, atol=0,
                                       err_msg=f"{feature} {name}")


# ------------------------------------------------------------------------------- recorded, then exported
def test_exported_stats_equal_lerobots_compute_episode_stats_on_the_same_frames(recorded: Recorded,
                                                                               tmp_path: Path) -> None:
    exported = exported_episode_stats(recorded.dataset)
    assert len(exported) == EPISODES
    for episode in range(EPISODES):
        theirs = lerobot_episode_stats(recorded.dataset, episode, recorded.frames[episode], tmp_path / str(episode))
        assert int(theirs[CAMERA]["count"][0]) == 100  # LeRobot's sample of 130 frames
        assert_stats_equal(exported[episode], theirs)


def test_dataset_stats_are_lerobots_aggregate_of_the_episodes(recorded: Recorded) -> None:
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.io_utils import load_stats

    assert_stats_equal(load_stats(recorded.dataset.resolve()), aggregate_stats(exported_episode_stats(recorded.dataset)))


def test_export_decodes_no_video_for_recorded_stats(recorded: Recorded, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import demoforge.storage.lerobot.files as files

    def no_decoding(*_args, **_kwargs):
        raise AssertionError("export decoded video although the episodes carry their statistics")

    monkeypatch.setattr(files, "decode_indices", no_decoding)
    monkeypatch.setattr(files, "decode_codes", no_decoding)
    store, again = tmp_path / "store", tmp_path / "again"
    shutil.copytree(recorded.store, store)
    db = sqlite3.connect(store / "catalog.sqlite")
    db.execute("UPDATE attempts SET state = 'committed', dataset_index = NULL WHERE state = 'exported'")
    db.commit()
    db.close()
    assert export_store(store, again).exported == EPISODES
    for ours, before in zip(exported_episode_stats(again), exported_episode_stats(recorded.dataset), strict=True):
        assert_stats_equal(ours, before)


def test_verify_catches_tampered_statistics(recorded: Recorded, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(recorded.store, store)
    group = next((store / "staging.zarr" / "episodes").iterdir()) / "zarr.json"
    meta = json.loads(group.read_text())
    meta["attributes"][STATS_ATTRIBUTE]["cameras"]["cam"]["mean"]["values"][0] += 0.01
    group.write_text(json.dumps(meta))
    check = run_cli("verify", "--store", str(store), "--no-quarantine")
    assert check.returncode == 1 and "content hash differs" in check.stdout + check.stderr, check.stdout

    # Tampered consistently (the catalog's hash recomputed too): the numeric statistics no longer fit the data.
    meta["attributes"][STATS_ATTRIBUTE]["state"]["observation.state"]["mean"]["values"][0] += 1.0
    group.write_text(json.dumps(meta))
    with open_store(store) as view:
        _fp, staging = view.require_job()
        row = next(r for r in view.attempts(("exported",)) if r.episode_id == group.parent.name)
        rehashed = staging.read_episode(row.episode_id, row.frames or 0, row.video_bytes).content_hash()
    db = sqlite3.connect(store / "catalog.sqlite")
    db.execute("UPDATE attempts SET content_hash = ? WHERE episode_id = ?", (rehashed, row.episode_id))
    db.commit()
    db.close()
    check = run_cli("verify", "--store", str(store), "--no-quarantine")
    assert check.returncode == 1 and "stored statistics of state/observation.state differ from its data" in \
        check.stdout + check.stderr, check.stdout


# ------------------------------------------------------------------------------------- older stores
@pytest.mark.parametrize("staging_format", [1, 2])
def test_episodes_staged_before_stats_export_with_lerobots_stats(staging_format: int, tmp_path: Path) -> None:
    """Their frames exist only as staged video: the stats are LeRobot's of those frames, decoded."""
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    store.mkdir()
    with tarfile.open(OLD_STORES[staging_format]) as tar:
        tar.extractall(store, filter="data")
    export = run_cli("export", "--store", str(store), "--out", str(dataset))
    assert export.returncode == 0 and "exported 3 episode(s)" in export.stdout, export.stderr
    exported = exported_episode_stats(dataset)
    with open_store(store) as view:
        _fp, staging = view.require_job()
        rows = view.attempts(("exported",))
        staged = [staging.read_episode(r.episode_id, r.frames or 0, r.video_bytes) for r in rows]
    assert all(ep.stats is None for ep in staged)  # no recorded stats in these formats
    for episode, ep in enumerate(staged):
        decoded = list(decode_frames(ep.video["cam"]))
        assert_stats_equal(exported[episode], lerobot_episode_stats(dataset, episode, decoded, tmp_path / str(episode)))


# ------------------------------------------------------------------------------- the arithmetic itself
def same_bits(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key].shape == value.shape and ours[key].dtype == value.dtype, key
        assert np.array_equal(ours[key], value, equal_nan=True), (key, ours[key], value)


def test_stats_arithmetic_is_lerobots_to_the_bit() -> None:
    """Random frames and vectors of several lengths and sizes, against LeRobot's own functions."""
    from lerobot.datasets import compute_stats as lerobot

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 99, 100, 101, 150, 470, 1200):
        assert lerobot_stats.sample_indices(n) == lerobot.sample_indices(n)
    for h, w in ((16, 16), (299, 299), (300, 200), (480, 640), (200, 700)):
        chw = np.zeros((3, h, w), np.uint8)
        assert lerobot.auto_downsample_height_width(chw).shape[1:] == lerobot_stats.strided(chw.transpose(1, 2, 0)).shape[:2]
    for shape, dtype in (((150, 2), np.float32), ((150,), np.float32), ((1, 3), np.float32), ((1,), np.int64),
                         ((130,), np.int64), ((400, 14), np.float32)):
        values = (rng.standard_normal(shape) * 3).astype(dtype)
        same_bits(lerobot_stats.vector_stats(values), lerobot.get_feature_stats(values, axis=0, keepdims=values.ndim == 1))
    constant = np.full(50, 3, np.int64)
    same_bits(lerobot_stats.vector_stats(constant), lerobot.get_feature_stats(constant, axis=0, keepdims=True))
    for n, h, w in ((1, 8, 8), (5, 16, 16), (130, 24, 40), (12, 224, 224)):
        frames = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
        frames[:, :, :5] = 7  # a repeated value: ties in the histogram
        sampled = lerobot.sample_indices(n)
        theirs = lerobot.get_feature_stats(frames[sampled].transpose(0, 3, 1, 2), axis=(0, 2, 3), keepdims=True)
        theirs = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in theirs.items()}
        same_bits(lerobot_stats.rgb_stats(frames[i] for i in sampled), theirs)
    # Frames of 300 px or more are strided; the recorder keeps them as planes (storage/sampled_frames.py).
    for n, h, w in ((130, 300, 420), (40, 480, 640)):
        frames = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
        frames[:, :, :9] = 200
        kept = SampledFrames(CameraSpec("cam", h, w))
        for frame in frames:
            kept.add(frame)
        sampled = lerobot.sample_indices(n)
        chw = np.stack([lerobot.auto_downsample_height_width(frames[i].transpose(2, 0, 1)) for i in sampled])
        theirs = lerobot.get_feature_stats(chw, axis=(0, 2, 3), keepdims=True)
        theirs = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in theirs.items()}
        same_bits(kept.statistics(), theirs)
        kept.close()
        # The export sums strided views of decoded frames where they lie (no copy): the same bits.
        same_bits(lerobot_stats.rgb_stats(lerobot_stats.strided(frames[i]) for i in sampled), theirs)
    with pytest.raises(ValueError, match=r"\(h, w, 3\) uint8.*float32"):
        lerobot_stats.RgbStats().add(np.zeros((4, 4, 3), np.float32))
    depth = (rng.random((120, 32, 48)) * 3).astype(np.float32)
    sampled = lerobot.sample_indices(120)
    theirs = lerobot.get_feature_stats(depth[sampled][:, None], axis=(0, 2, 3), keepdims=True)
    theirs = {k: v if k == "count" else np.squeeze(v / 1.0, axis=0) for k, v in theirs.items()}
    same_bits(lerobot_stats.depth_stats(depth[sampled]), theirs)


def test_data_parquet_table_is_what_datasets_builds(recorded: Recorded) -> None:
    """The data parquet's arrow table, built from numpy directly, equals ``datasets.Dataset.from_dict``'s (the
    way LeRobot's writer builds it), schema metadata included."""
    import datasets
    from lerobot.datasets.feature_utils import get_hf_features_from_features

    from demoforge.storage.lerobot.format import dataset_features

    with open_store(recorded.store) as view:
        fingerprint, staging = view.require_job()
        rows = view.attempts(("exported",))
        episodes: list[tuple[StagedEpisode, dict]] = [
            (staging.read_episode(r.episode_id, r.frames or 0, r.video_bytes), r.record or {}) for r in rows]
    features = dataset_features(fingerprint)
    cols = [episode_frames(ep, i, i * 130, 0, fingerprint.fps, record) for i, (ep, record) in enumerate(episodes)]
    ours = _arrow_table(cols, data_schema(features))
    hf = get_hf_features_from_features({k: {**v, "shape": tuple(v["shape"])} for k, v in features.items()})

    def column(value, key: str) -> list:
        if not isinstance(value, np.ndarray):
            return list(value)
        return (value.reshape(len(value)) if tuple(features[key]["shape"]) == (1,) else value).tolist()

    merged = {key: [v for c in cols for v in column(c[key], key)] for key in hf}
    theirs = datasets.Dataset.from_dict(merged, features=hf, split="train").with_format("arrow")[:]
    assert ours.equals(theirs, check_metadata=True)
