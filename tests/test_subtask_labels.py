"""Segments as LeRobot's sub-task annotation columns (storage/lerobot/subtasks.py), read back with LeRobot's own
loaders and SARM's own checks and progress functions, and kept aligned by edit and merge."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from demoforge.storage.lerobot.format import read_sidecar
from demoforge.storage.lerobot.subtasks import temporal_proportions
from helpers import run_cli

PUSH = ("--task", "metaworld-push-v3", "--option", "camera=none")
FPS = 80


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("sarm")
    # "a" is exported in two steps (an export appended to a dataset recomputes the proportions over all of it)
    for name, seed, counts in (("a", "1", ("2", "3")), ("b", "2", ("3",))):
        for episodes in counts:
            done = run_cli("generate", *PUSH, "--episodes", episodes, "--seed", seed, "--store",
                           str(root / f"{name}-s"), "--export", str(root / name))
            assert done.returncode == 0, done.stderr
    return root


def episodes_frame(dataset: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    return LeRobotDatasetMetadata("local/sarm", root=dataset).episodes.to_pandas()


def assert_labels_match_the_sidecar(dataset: Path) -> None:
    """Every episode's columns are its recorded segments' spans, and the proportion files their means."""
    from lerobot.data_processing.sarm_annotations.subtask_annotation import load_annotations_from_dataset

    records = read_sidecar(dataset)
    frame = episodes_frame(dataset)
    assert len(frame) == len(records)
    for mode in ("sparse", "dense"):
        loaded = load_annotations_from_dataset(dataset, prefix=mode)
        assert sorted(loaded) == list(range(len(records)))
        for (_, episode), record in zip(frame.iterrows(), records):
            segments = record["segments"]
            assert list(episode[f"{mode}_subtask_names"]) == [s["name"] for s in segments]
            assert list(episode[f"{mode}_subtask_start_frames"]) == [s["start_step"] for s in segments]
            assert list(episode[f"{mode}_subtask_end_frames"]) == [s["end_step"] - 1 for s in segments]
            assert list(episode[f"{mode}_subtask_start_times"]) == [s["start_step"] / FPS for s in segments]
            assert [a.name for a in loaded[int(episode["episode_index"])].subtasks] == [s["name"] for s in segments]
        written = json.loads((dataset / "meta" / f"temporal_proportions_{mode}.json").read_text())
        expected = temporal_proportions(([s["name"] for s in r["segments"]], [s["start_step"] for s in r["segments"]],
                                         [s["end_step"] - 1 for s in r["segments"]], r["length"]) for r in records)
        assert written == pytest.approx(expected) and sum(written.values()) == pytest.approx(1.0)


def test_exports_carry_the_segments_as_lerobots_sub_task_columns(exports, caplog) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.rewards.sarm.processor_sarm import SARMEncodingProcessorStep

    dataset = exports / "a"
    assert len(read_sidecar(dataset)) == 3  # two exports into one dataset
    assert_labels_match_the_sidecar(dataset)
    names = list(json.loads((dataset / "meta/temporal_proportions_dense.json").read_text()))
    step = SimpleNamespace(dataset_meta=LeRobotDatasetMetadata("local/sarm", root=dataset),
                           dense_subtask_names=names, sparse_subtask_names=names,
                           _resolve_annotation_column=SARMEncodingProcessorStep._resolve_annotation_column,
                           _annotations_are_usable=SARMEncodingProcessorStep._annotations_are_usable)
    with caplog.at_level(logging.WARNING):
        SARMEncodingProcessorStep._validate_annotation_columns(step)  # SARM's own check before training
    assert "unusable annotations" not in caplog.text


def test_sarm_progress_follows_the_recorded_segments_frame_by_frame(exports) -> None:
    """LeRobot's find_stage_and_tau puts every frame in the stage of the segment that recorded it; the progress
    it normalises is monotone within an episode, 0 where an episode starts with the first stage."""
    from lerobot.rewards.sarm.sarm_utils import find_stage_and_tau, normalize_stage_tau

    dataset = exports / "a"
    proportions = json.loads((dataset / "meta/temporal_proportions_dense.json").read_text())
    names = list(proportions)
    for (_, episode), record in zip(episodes_frame(dataset).iterrows(), read_sidecar(dataset)):
        length, segments = int(episode["length"]), record["segments"]
        progress = []
        for segment in segments:
            for frame in range(segment["start_step"], segment["end_step"]):
                stage, _tau = find_stage_and_tau(frame, length, list(episode["dense_subtask_names"]),
                                                 list(episode["dense_subtask_start_frames"]),
                                                 list(episode["dense_subtask_end_frames"]), names, proportions)
                assert names[stage] == segment["name"]
                combined = find_stage_and_tau(frame, length, list(episode["dense_subtask_names"]),
                                              list(episode["dense_subtask_start_frames"]),
                                              list(episode["dense_subtask_end_frames"]), names, proportions,
                                              return_combined=True)
                progress.append(normalize_stage_tau(combined, temporal_proportions=proportions, subtask_names=names))
        assert np.all(np.diff(progress) >= 0) and progress[-1] > 0.99
        if segments[0]["name"] == names[0]:
            assert progress[0] == 0.0


def test_edit_and_merge_keep_the_labels_aligned(exports, tmp_path) -> None:
    edited = tmp_path / "edited"
    done = run_cli("edit", str(exports / "a"), "--delete", "1", "--out", str(edited))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_sidecar(edited)) == 2
    assert_labels_match_the_sidecar(edited)
    merged = tmp_path / "merged"
    done = run_cli("merge", str(edited), str(exports / "b"), "--out", str(merged))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_sidecar(merged)) == 5
    assert_labels_match_the_sidecar(merged)


def test_frames_carry_lerobot_evals_outcome_flags(exports) -> None:
    """next.success and next.done, named and typed as lerobot-eval records them: done at the frame that ends the
    episode, success there when it succeeded; LeRobotDataset reads them as booleans."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = exports / "a"
    features = json.loads((dataset / "meta/info.json").read_text())["features"]
    for key in ("next.success", "next.done"):
        assert features[key] == {"dtype": "bool", "shape": [1], "names": None}
    frames = LeRobotDataset("local/outcomes", root=dataset)
    records = read_sidecar(dataset)
    ends = {int(e["dataset_to_index"]) - 1 for _, e in episodes_frame(dataset).iterrows()}
    for i in range(len(frames)):
        item = frames[i]
        assert bool(item["next.done"]) == (i in ends)
        assert bool(item["next.success"]) == (i in ends and records[int(item["episode_index"])]["success"])
    stats = json.loads((dataset / "meta/stats.json").read_text())
    assert stats["next.done"]["max"] == [1.0] and stats["next.done"]["min"] == [0.0]
