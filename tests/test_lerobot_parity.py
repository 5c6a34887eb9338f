"""What demoforge writes without importing ``lerobot.datasets`` (which costs seconds of torch and ``datasets``
imports in every export process) equals what LeRobot 0.6.1's own helpers give on the same input: the layout
names and chunk numbering, the data parquet's arrow schema with its ``huggingface`` metadata, the aggregated
statistics and the bytes of ``meta/stats.json``. A LeRobot release that changes any of them fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import toy_tasks  # noqa: F401  (registers toy-point)
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.lerobot import format as fmt
from demoforge.storage.lerobot.arrow_schema import data_schema
from demoforge.storage.lerobot_stats import vector_stats
from demoforge.storage.lerobot.stats_file import StatsShapeError, aggregate_stats, read_stats, stats_json_text
from demoforge.storage.lerobot.validate import validate_dataset
from helpers import REPO, cli_env


def test_layout_names_and_chunk_numbering_are_lerobots():
    from lerobot.datasets import utils
    from lerobot.datasets.language import language_feature_info

    assert fmt.DATA_PATH == utils.DEFAULT_DATA_PATH
    assert fmt.VIDEO_PATH == utils.DEFAULT_VIDEO_PATH
    assert fmt.EPISODES_PATH == utils.DEFAULT_EPISODES_PATH
    assert (fmt.TASKS, fmt.STATS, fmt.INFO) == (utils.DEFAULT_TASKS_PATH, utils.STATS_PATH, utils.INFO_PATH)
    assert fmt.CHUNKS_SIZE == utils.DEFAULT_CHUNK_SIZE
    assert (fmt.DATA_FILE_MB, fmt.VIDEO_FILE_MB) == (utils.DEFAULT_DATA_FILE_SIZE_IN_MB,
                                                    utils.DEFAULT_VIDEO_FILE_SIZE_IN_MB)
    for cursor in [(0, 0), (0, 1), (0, fmt.CHUNKS_SIZE - 2), (0, fmt.CHUNKS_SIZE - 1), (3, fmt.CHUNKS_SIZE - 1)]:
        assert fmt.next_file(*cursor) == utils.update_chunk_file_indices(*cursor, fmt.CHUNKS_SIZE)
    theirs = {k: {**v, "shape": list(v["shape"])} for k, v in language_feature_info().items()}
    assert {k: dict(v) for k, v in fmt.LANGUAGE_FEATURES.items()} == theirs


def _lerobot_schema(features):
    from lerobot.datasets.feature_utils import get_hf_features_from_features

    return get_hf_features_from_features({k: {**v, "shape": tuple(v["shape"])} for k, v in features.items()}
                                         ).arrow_schema


@pytest.mark.parametrize("task, options", [
    ("toy-point", {}),
    ("fetch-pick-place", {}),
    ("aloha-transfer-cube", {}),
    ("so101-pick-place", {}),  # named features ("shoulder_pan.pos", ...)
    ("metaworld-pick-place-v3", {}),
    ("fetch-pick-place", {"depth": True}),
])
def test_data_schema_is_lerobots_with_its_metadata(task, options):
    from demoforge.storage.lerobot.format import dataset_features

    spec = JobSpec(task=task, episodes=1, task_options=options)
    features = dataset_features(spec.fingerprint())
    ours, theirs = data_schema(features), _lerobot_schema(features)
    assert ours.equals(theirs, check_metadata=True), f"\n{ours}\n{ours.metadata}\n!=\n{theirs}\n{theirs.metadata}"


def test_data_schema_of_other_dtypes_and_shapes_is_lerobots():
    features = {"a": {"dtype": "float64", "shape": [3], "names": None},
                "b": {"dtype": "int32", "shape": [1], "names": None},
                "c": {"dtype": "bool", "shape": [1], "names": None},
                "d": {"dtype": "string", "shape": [1], "names": None},
                "grid": {"dtype": "float32", "shape": [2, 3], "names": None},  # LeRobot's own mapping
                **{k: dict(v) for k, v in fmt.LANGUAGE_FEATURES.items()}}
    assert data_schema(features).equals(_lerobot_schema(features), check_metadata=True)
    del features["grid"]
    assert data_schema(features).equals(_lerobot_schema(features), check_metadata=True)


def _episode_stats(rng: np.random.Generator, n: int) -> dict[str, dict[str, np.ndarray]]:
    from demoforge.storage.lerobot_stats import rgb_stats

    return {"observation.state": vector_stats(rng.normal(size=(n, 4)).astype(np.float32)),
            "index": vector_stats(np.arange(n, dtype=np.int64) + int(rng.integers(0, 1000))),
            "observation.images.cam": rgb_stats(rng.integers(0, 256, (8, 12, 3), dtype=np.uint8) for _ in range(5))}


def test_aggregated_stats_and_the_stats_file_are_lerobots(tmp_path: Path):
    from lerobot.datasets.compute_stats import aggregate_stats as lerobot_aggregate
    from lerobot.datasets.io_utils import load_stats, write_stats

    rng = np.random.default_rng(3)
    parts = [_episode_stats(rng, n) for n in (5, 17, 40)]
    parts[1] = {k: v for k, v in parts[1].items() if k != "index"}  # a feature some parts lack
    ours, theirs = aggregate_stats(parts), lerobot_aggregate(parts)
    assert ours.keys() == theirs.keys()
    for feature in ours:
        assert ours[feature].keys() == theirs[feature].keys()
        for name in ours[feature]:
            np.testing.assert_array_equal(ours[feature][name], theirs[feature][name])
            assert ours[feature][name].dtype == theirs[feature][name].dtype
    # LeRobot writes the features in its set's order (it changes from process to process); ours come in the
    # order they first appear. The same statistics in our order are written byte for byte as LeRobot writes them.
    assert list(ours) == list(dict.fromkeys(k for part in parts for k in part))
    write_stats(ours, tmp_path)
    assert stats_json_text(ours) == (tmp_path / "meta" / "stats.json").read_text(encoding="utf-8")
    write_stats(theirs, tmp_path)
    loaded, lerobot_loaded = read_stats(tmp_path / "meta" / "stats.json"), load_stats(tmp_path)
    assert loaded is not None and lerobot_loaded is not None
    for feature in lerobot_loaded:
        for name, value in lerobot_loaded[feature].items():
            np.testing.assert_array_equal(loaded[feature][name], value)
            assert loaded[feature][name].dtype == value.dtype
    assert read_stats(tmp_path / "missing.json") is None


def test_stats_lerobot_would_refuse_are_refused_by_name():
    good = vector_stats(np.arange(4, dtype=np.float32))
    with pytest.raises(StatsShapeError, match="'count' of 'x'"):
        aggregate_stats([{"x": {**good, "count": np.array([[4]])}}])
    with pytest.raises(StatsShapeError, match="'mean' of 'x'"):
        aggregate_stats([{"x": {**good, "mean": np.float32(1.0)}}])  # type: ignore[dict-item]  # a scalar on purpose


def test_an_export_process_imports_neither_lerobot_nor_torch(tmp_path: Path):
    """Exporting, verifying and editing a dataset needs pyarrow and PyAV only: a small export starts in about a
    second instead of the seconds torch and ``datasets`` take to import."""
    run_job(JobSpec(task="toy-point", episodes=2, video=VideoSettings(codec="h264")), tmp_path / "store")
    probe = ("import json, runpy, sys\n"
             "sys.argv = ['demoforge'] + sys.argv[1:]\n"
             "try:\n"
             "    runpy.run_module('demoforge.pipeline.cli', run_name='__main__')\n"
             "except SystemExit as exc:\n"
             "    code = exc.code\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lerobot', 'datasets'))\n"
             "print(json.dumps({'code': code, 'heavy': heavy[:5]}))\n")
    for args in (["export", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "ds")],
                 ["verify", str(tmp_path / "ds")],
                 ["edit", str(tmp_path / "ds"), "--delete", "0"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=REPO,
                             env=cli_env(), stdin=subprocess.DEVNULL, timeout=120)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result == {"code": 0, "heavy": []}, (args, result, out.stderr[-2000:])
    check = validate_dataset(tmp_path / "ds")  # and LeRobot loads what was written
    assert check.status == 0 and check.episodes == 1, check.to_json()
