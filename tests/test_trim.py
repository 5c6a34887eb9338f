"""`demoforge edit --trim`: frames dropped at an episode's start and end, by named segments or by counts, on our
datasets and on one LeRobot wrote: loaded by LeRobotDataset with both video backends, rows equal to the source's
kept rows (the re-based columns renumbered), frames within the codec's tolerance where the smart cut re-encoded
them and bit-identical elsewhere, segments / SARM columns / statistics re-based; every refusal is one line,
exit 2, nothing written; a killed trim leaves the dataset as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import toy_tasks  # noqa: F401
from demoforge.storage.lerobot.edit import ALREADY, WRITTEN, edit_dataset
from demoforge.storage.lerobot.edit_trim import TrimSpec
from demoforge.storage.lerobot.episode_filter import parse_filter
from demoforge.storage.lerobot.export import export_stores
from demoforge.storage.lerobot_stats import sample_indices
from edit_helpers import (
    CAM,
    copy_dataset,
    episode_frames,
    episodes_meta,
    lerobot_written_dataset,
    sidecar,
    toy_store,
    tree,
    violations,
)
from helpers import demoforge_argv, kill_at_step, psnr, run_cli

pytestmark = pytest.mark.slow

REBASED = ("frame_index", "timestamp", "annotation.episode_step", "annotation.segment_id", "language_persistent")
RENUMBERED = ("episode_index", "index", "task_index")
FPS = 10  # toy-point's


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Three toy-point episodes of 14 frames (segments approach 0-6, retreat 7-13; h264, a keyframe every 2
    frames: frame 7 is not one) and their export."""
    root = tmp_path_factory.mktemp("trim")
    store = toy_store(root / "store", 3, steps=14)
    dataset = root / "dataset"
    export_stores([store], dataset)
    return dataset


def rows(dataset: Path, index: int) -> dict[str, list]:
    table = pq.read_table(sorted(dataset.resolve().glob("data/*/*.parquet")))
    return table.filter(np.asarray(table["episode_index"].to_numpy()) == index).to_pydict()


def kept_rows_equal(trimmed: dict[str, list], source: dict[str, list], first: int, count: int,
                    ignore: tuple[str, ...] = ()) -> None:
    """Every column but the renumbered and re-based ones (and ``ignore``) is the source's rows [first, first + count)."""
    assert set(trimmed) == set(source)
    for column, values in trimmed.items():
        if column not in RENUMBERED + REBASED + ignore:
            assert values == source[column][first:first + count], column
    assert trimmed["frame_index"] == list(range(count))
    assert trimmed["timestamp"] == pytest.approx([t / FPS for t in range(count)], abs=1e-6)


def numeric_stats_equal_lerobots(dataset: Path, index: int, keys: tuple[str, ...]) -> None:
    """The episode's statistics in meta/episodes are what LeRobot's compute_episode_stats gives its rows."""
    from lerobot.datasets.compute_stats import compute_episode_stats

    info = json.loads((dataset.resolve() / "meta" / "info.json").read_text())
    data = rows(dataset, index)
    meta = episodes_meta(dataset)[index]
    expected = compute_episode_stats({k: np.asarray(data[k]) for k in keys}, info["features"])
    for key in keys:
        for stat, value in expected[key].items():
            np.testing.assert_allclose(meta[f"stats/{key}/{stat}"], value, rtol=1e-6, atol=1e-9,
                                       err_msg=f"{key} {stat}")


def test_trim_by_segments_and_at_the_end_rebases_everything_our_dataset_records(toy, tmp_path):
    dataset = copy_dataset(toy, tmp_path)
    before_rows = [rows(toy, i) for i in range(3)]
    before_frames = [episode_frames(toy, i) for i in range(3)]
    before_records = sidecar(toy)

    # the first segment of episodes 0 and 2 (--keep-where chooses them; episode 1 stays as it is)
    report = edit_dataset(dataset, trim=TrimSpec(segments=("approach",)), keep_where=parse_filter("index != 1"))
    (out,) = report.outputs
    assert (out.status, out.version, out.episodes, out.frames) == (WRITTEN, "v000002", 3, 28)
    assert (out.trimmed_episodes, out.trimmed_frames) == (2, 14) and report.removed == {}
    assert out.reencoded_frames == 2  # frame 7 of each: the smart cut up to the keyframe at 8
    assert violations(dataset, backends=("pyav", "torchcodec")) == []
    for index in (0, 2):
        trimmed = rows(dataset, index)
        kept_rows_equal(trimmed, before_rows[index], 7, 7)
        assert trimmed["annotation.episode_step"] == list(range(7)) and set(trimmed["annotation.segment_id"]) == {0}
        assert trimmed["annotation.segment_start"][0] == 1 and trimmed["annotation.terminated"][-1] == 1
        assert trimmed["language_persistent"][0] == [{**before_rows[index]["language_persistent"][0][1],
                                                      "timestamp": 0.0}]
        frames = episode_frames(dataset, index)
        assert len(frames) == 7 and psnr(frames[0], before_frames[index][7]) > 30  # re-encoded
        assert all(np.array_equal(a, b) for a, b in zip(frames[1:], before_frames[index][8:]))  # copied
        record = sidecar(dataset)[index]
        assert record["length"] == 7 and record["trim"] == {"start": 7, "end": 0}
        assert [(s["segment_id"], s["name"], s["start_step"], s["end_step"]) for s in record["segments"]] == \
            [(0, "retreat", 0, 7)]
        meta = episodes_meta(dataset)[index]
        assert (meta["length"], meta["sparse_subtask_names"], meta["sparse_subtask_start_frames"],
                meta["sparse_subtask_end_frames"], meta["dense_subtask_end_times"]) == (7, ["retreat"], [0], [6], [0.6])
        numeric_stats_equal_lerobots(dataset, index, ("action", "observation.state", "annotation.segment_id",
                                                      "timestamp", "frame_index", "index"))
        camera = {k.split("/")[-1]: np.asarray(v) for k, v in meta.items() if k.startswith(f"stats/{CAM}/")}
        assert camera["count"].tolist() == [len(sample_indices(7))]
        expected = np.mean(np.stack(before_frames[index][7:]).astype(np.float64), axis=(0, 1, 2)) / 255
        np.testing.assert_allclose(camera["mean"].reshape(3), expected, atol=1e-4)
    assert rows(dataset, 1) == {**before_rows[1], "index": [i - 7 for i in before_rows[1]["index"]]}
    assert sidecar(dataset)[1] == before_records[1]
    proportions = json.loads((dataset.resolve() / "meta" / "temporal_proportions_dense.json").read_text())
    assert proportions["retreat"] > proportions["approach"]
    stats = json.loads((dataset.resolve() / "meta" / "stats.json").read_text())
    every = np.concatenate([np.asarray(rows(dataset, i)["action"]) for i in range(3)])
    np.testing.assert_allclose(stats["action"]["mean"], every.mean(axis=0), rtol=1e-6)
    assert stats["action"]["count"] == [28]
    # the same trim again is reported, not applied twice
    again = edit_dataset(dataset, trim=TrimSpec(segments=("approach",)), keep_where=parse_filter("index != 1"))
    assert again.outputs[0].status == ALREADY

    # the last segment of episode 1: it now ends where the recording was cut (truncated, done, its success)
    report = edit_dataset(dataset, trim=TrimSpec(segments=("retreat",)), keep_where=parse_filter("index == 1"))
    assert (report.outputs[0].trimmed_frames, report.outputs[0].reencoded_frames) == (7, 0)
    assert violations(dataset) == []
    trimmed = rows(dataset, 1)
    kept_rows_equal(trimmed, before_rows[1], 0, 7, ignore=("annotation.truncated", "next.done", "next.success"))
    assert trimmed["annotation.truncated"] == [0] * 6 + [1] and trimmed["annotation.terminated"] == [0] * 7
    assert trimmed["next.done"] == [False] * 6 + [True] and trimmed["next.success"] == [False] * 6 + [True]
    assert trimmed["language_persistent"][0] == before_rows[1]["language_persistent"][0][:1]
    assert all(np.array_equal(a, b) for a, b in zip(episode_frames(dataset, 1), before_frames[1][:7]))
    assert sidecar(dataset)[1]["trim"] == {"start": 0, "end": 7}
    assert sidecar(dataset)[1]["success"] is True  # the outcome of the episode stays recorded


def test_trim_by_counts_of_a_lerobot_dataset_is_smart_cut_and_loads(tmp_path):
    source = lerobot_written_dataset(tmp_path / "foreign")
    before = tree(source)
    out = tmp_path / "trimmed"
    report = edit_dataset(source, trim=TrimSpec(start=2, end=3), out=out)
    (written,) = report.outputs
    assert (written.episodes, written.frames, written.trimmed_episodes, written.trimmed_frames) == (3, 12, 3, 15)
    assert written.reencoded_frames == 6  # frames 2 and 3 of each episode, up to its keyframe at 4
    assert tree(source) == before  # demoforge never modifies a dataset it did not write
    assert violations(out, demoforge=False, backends=("pyav", "torchcodec")) == []
    for index, length in enumerate((9, 11, 7)):
        kept = length - 5
        kept_rows_equal(rows(out, index), rows(source, index), 2, kept)
        frames, original = episode_frames(out, index), episode_frames(source, index)[2:length - 3]
        assert len(frames) == kept
        assert min(psnr(a, b) for a, b in zip(frames[:2], original[:2])) > 25  # the smart cut's re-encoded frames
        assert all(np.array_equal(a, b) for a, b in zip(frames[2:], original[2:]))  # copied
        assert episodes_meta(out)[index]["length"] == kept
        numeric_stats_equal_lerobots(out, index, ("action", "observation.state", "timestamp", "frame_index"))


def test_every_refusal_is_one_line_exit_2_and_nothing_written(toy, tmp_path):
    dataset = copy_dataset(toy, tmp_path / "copy")
    foreign = lerobot_written_dataset(tmp_path / "foreign")
    before, before_foreign = tree(tmp_path), tree(foreign)
    cases = [
        ((str(dataset), "--trim", "start=3"), "--trim start=3 cuts episode 0 at frame 3, inside its segment "
                                             "'approach' (frames 0-6)"),
        ((str(dataset), "--trim", "end=2", "--keep-where", "index == 2"), "inside its segment 'retreat'"),
        ((str(dataset), "--trim", "segments=idle+retreat"), "no segment is named 'idle'"),
        ((str(dataset), "--trim", "segments=approach+retreat"), "would leave episode 0 empty"),
        ((str(dataset), "--trim", "start=7,end=7"), "would leave episode 0 (14 frames) empty"),
        ((str(dataset), "--trim", "start=x"), "start=x is not a number of frames"),
        ((str(dataset), "--trim", "start=0"), "drops no frame"),
        ((str(dataset), "--trim", "start=7,segments=retreat"), "by counts (start=, end=) or by segments"),
        ((str(dataset), "--trim", "start=7", "--delete", "1"), "--trim is an edit of its own"),
        ((str(foreign), "--trim", "segments=approach", "--out", str(tmp_path / "new")), "records no segments"),
        ((str(foreign), "--trim", "start=2"), "demoforge never modifies it"),
    ]
    for argv, fragment in cases:
        result = run_cli("edit", *argv)
        assert (result.returncode, result.stdout) == (2, ""), (argv, result)
        assert result.stderr.strip().count("\n") == 0 and fragment in result.stderr, (argv, result.stderr)
    assert tree(tmp_path) == before and tree(foreign) == before_foreign


def test_a_killed_trim_leaves_the_published_version(toy, tmp_path):
    dataset = copy_dataset(toy, tmp_path)
    before = tree(dataset.resolve())
    kill_at_step(demoforge_argv("edit", str(dataset), "--trim", "segments=retreat"), "after_data",
                 tmp_path / "reached")
    assert dataset.resolve().name == "v000001" and tree(dataset.resolve()) == before
    result = run_cli("edit", str(dataset), "--trim", "segments=retreat")  # the re-run makes the edit
    assert result.returncode == 0 and "trimmed 3 episode(s): 21 frame(s) dropped" in result.stdout, result
    assert dataset.resolve().name == "v000002" and violations(dataset) == []
    assert sorted(p.name for p in dataset.resolve().parent.iterdir() if p.name.endswith(".partial")) == []
