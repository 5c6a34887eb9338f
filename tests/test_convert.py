"""`demoforge convert --format lerobot-v2.1`: read back by LeRobot 0.6.1's own v2.1 -> v3.0 converter and compared
with our v3.0 export of the same store (rows exact, frames decoded with PyAV), segments and success recovered from
the sidecar; a dataset re-encoded as one stream is smart-cut (only frames before a keyframe re-encoded, and
reported); bad input is one line, exit 2, nothing written; a kill leaves only OUT.partial-*. (robomimic HDF5 and
RLDS are tested in tests/test_convert_hdf5.py and beside it.)"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.convert import convert
from demoforge.storage.lerobot.export import export_stores
from demoforge.storage.lerobot.stats_file import read_stats
from edit_helpers import continuous_reencode, episode_frames, episodes_meta, lerobot_written_dataset, sidecar, tree
from helpers import demoforge_argv, kill_at_step, psnr, run_cli

pytestmark = pytest.mark.slow

IMAGE = "observation.image"  # Meta-World's camera key
LANGUAGE = ("language_persistent", "language_events")


@pytest.fixture(scope="module")
def reach(tmp_path_factory):
    """Two metaworld-reach-v3 episodes at 64x64 (h264) and their v3.0 export."""
    root = tmp_path_factory.mktemp("convert")
    store = root / "store"
    report = run_job(JobSpec(task="metaworld-reach-v3", episodes=2,
                             task_options={"image_size": 64, "antialias": False},
                             video=VideoSettings(codec="h264")), store)
    assert report.complete
    dataset = root / "dataset"
    export_stores([store], dataset)
    return {"store": store, "dataset": dataset}


def _lerobot_back(v21: Path, where: Path) -> Path:
    """A copy of a v2.1 dataset converted to v3.0 by LeRobot 0.6.1's own script (offline, local root)."""
    from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset

    back = where / "back"
    shutil.copytree(v21, back)
    convert_dataset(repo_id="local/back", root=str(back), push_to_hub=False)
    assert json.loads((back / "meta" / "info.json").read_text())["codebase_version"] == "v3.0"
    return back


def test_v21_converts_back_with_lerobots_own_converter_to_the_same_rows_frames_and_segments(reach, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    source = reach["dataset"]
    out = tmp_path / "v21"
    result = run_cli("convert", str(source), "--format", "lerobot-v2.1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "converted 2 episode(s), 68 frames" in result.stdout and "nothing re-encoded" in result.stdout
    assert not list(tmp_path.glob("v21.partial-*"))

    # the v2.1 layout: one parquet and one mp4 per episode, jsonl metadata, v2.1's info fields
    info = json.loads((out / "meta" / "info.json").read_text())
    assert (info["codebase_version"], info["total_episodes"], info["total_videos"], info["total_chunks"]) == \
        ("v2.1", 2, 2, 1)
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    assert not set(LANGUAGE) & set(info["features"])
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.*") if p.suffix in (".parquet", ".mp4")) == [
        "data/chunk-000/episode_000000.parquet", "data/chunk-000/episode_000001.parquet",
        f"videos/chunk-000/{IMAGE}/episode_000000.mp4", f"videos/chunk-000/{IMAGE}/episode_000001.mp4"]
    lines = [json.loads(line) for line in (out / "meta" / "episodes.jsonl").read_text().splitlines()]
    assert [(r["episode_index"], r["length"]) for r in lines] == [(0, 34), (1, 34)]
    modality = json.loads((out / "meta" / "modality.json").read_text())
    assert modality["video"] == {"image": {"original_key": IMAGE}} and modality["state"]["state"]["end"] == 4

    # segments and success: the sidecar is the export's, and each episode's annotation columns agree with it
    assert sidecar(out) == sidecar(source)
    for index, record in enumerate(sidecar(out)):
        rows = pq.read_table(out / f"data/chunk-000/episode_{index:06d}.parquet").to_pydict()
        starts = [t for t, flag in enumerate(rows["annotation.segment_start"]) if flag]
        assert starts == [s["start_step"] for s in record["segments"]] and record["segments"]
        assert record["success"] is True and rows["next.success"][-1] is True

    back = _lerobot_back(out, tmp_path)
    # rows: every non-video column of the export, exactly (the language columns are left out of v2.1)
    ours = pq.read_table(sorted(source.resolve().glob("data/*/*.parquet"))).to_pydict()
    theirs = pq.read_table(sorted(back.glob("data/*/*.parquet"))).to_pydict()
    assert set(theirs) == set(ours) - set(LANGUAGE)
    for column, values in theirs.items():
        assert values == ours[column], column
    # episode metadata: lengths, tasks, spans, statistics and SARM's sub-task columns
    for mine, converted in zip(episodes_meta(source), episodes_meta(back), strict=True):
        for key, value in mine.items():
            if key.endswith("_timestamp"):
                assert converted[key] == pytest.approx(value, abs=1e-9), key
            else:
                assert converted[key] == value, key
    ours_stats, their_stats = read_stats(source.resolve() / "meta/stats.json"), read_stats(back / "meta/stats.json")
    assert ours_stats is not None and their_stats is not None and set(their_stats) == set(ours_stats)
    for feature, per in ours_stats.items():
        for name, value in per.items():
            # LeRobot aggregates the episodes afresh; the export added them to its previous aggregate
            np.testing.assert_allclose(their_stats[feature][name], value, rtol=1e-6, err_msg=f"{feature} {name}")
    # frames: decoded with PyAV, the same pixels (packets were copied both ways)
    for index in range(2):
        a, b = episode_frames(source, index, IMAGE), episode_frames(back, index, IMAGE)
        assert len(a) == len(b) == 34
        assert min(psnr(x, y) for x, y in zip(a, b)) == math.inf
    dataset = LeRobotDataset("local/back", root=back, video_backend="pyav")
    assert len(dataset) == 68 and tuple(dataset[40][IMAGE].shape) == (3, 64, 64)


def _lerobot_dataset(root: Path) -> Path:
    """3 episodes (9, 11, 7 frames) written by LeRobot's own recorder (h264), its video then re-encoded as one
    stream with a keyframe every 4 frames: episodes 1 and 2 start between keyframes."""
    lerobot_written_dataset(root)
    continuous_reencode(root, g=4)
    return root


def test_an_episode_between_keyframes_is_smart_cut_and_reported(tmp_path, monkeypatch):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from demoforge.storage.lerobot.video_cut import VideoFile

    cam = "observation.images.cam"
    source = _lerobot_dataset(tmp_path / "foreign")
    report = convert(source, "lerobot-v2.1", tmp_path / "v21")
    reencoded = [n for n in report.notes if n.startswith("smart cut:")]
    assert report.episodes == 3 and reencoded, report.notes
    # episodes start at frames 0, 9 and 20; keyframes every 4: episode 1's frames 9-11 are re-encoded
    assert reencoded[0].startswith("smart cut: 3 frame(s) of 1 episode video(s) re-encoded"), reencoded
    count = 3
    assert not (tmp_path / "v21" / "meta" / "demoforge_episodes.jsonl").exists()  # LeRobot's: no segments
    # a file too big to hold in memory is read once for all its episodes: the same bytes
    monkeypatch.setattr(VideoFile, "HOLD_BYTES", 0)
    assert convert(source, "lerobot-v2.1", tmp_path / "unheld").notes == report.notes
    videos = sorted(p.relative_to(tmp_path / "v21") for p in (tmp_path / "v21").rglob("*.mp4"))
    assert len(videos) == 3 and all((tmp_path / "v21" / v).read_bytes() == (tmp_path / "unheld" / v).read_bytes()
                                    for v in videos)
    back = _lerobot_back(tmp_path / "v21", tmp_path)
    identical = 0
    for index, length in enumerate((9, 11, 7)):
        a, b = episode_frames(source, index, cam), episode_frames(back, index, cam)
        assert len(a) == len(b) == length
        assert min(psnr(x, y) for x, y in zip(a, b)) > 25  # re-encoded frames: the codec's tolerance
        identical += sum(1 for x, y in zip(a, b) if np.array_equal(x, y))
    assert identical >= 27 - count  # every frame not re-encoded is the source's, bit for bit
    assert len(LeRobotDataset("local/back", root=back, video_backend="pyav")) == 27


def test_bad_input_is_one_line_exit_2_and_nothing_written(reach, tmp_path):
    source = reach["dataset"]
    (tmp_path / "exists").mkdir()
    v21 = tmp_path / "v21"
    assert convert(source, "lerobot-v2.1", v21).episodes == 2
    before, versions = tree(tmp_path), tree(source.resolve().parent)
    cases = {
        ("--out", str(tmp_path / "exists")): "exists: a conversion is written to a new path",
        ("--out", str(source / "inside")): "is inside the dataset",
        ("--out", str(tmp_path / "no" / "such")): "does not exist",
    }
    for (flag, value), fragment in cases.items():
        result = run_cli("convert", str(source), "--format", "lerobot-v2.1", flag, value)
        assert (result.returncode, result.stdout) == (2, ""), (value, result)
        assert result.stderr.strip().count("\n") == 0 and fragment in result.stderr, result.stderr
        assert result.stderr.startswith("demoforge convert: error:"), result.stderr
    for dataset, fragment in ((reach["store"], "is not a LeRobot v3.0 dataset (no meta/info.json)"),
                              (v21, "is LeRobot format 'v2.1'; convert reads a v3.0 dataset")):
        result = run_cli("convert", str(dataset), "--format", "lerobot-v2.1", "--out", str(tmp_path / "new"))
        assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result
        assert fragment in result.stderr, result.stderr
    assert tree(tmp_path) == before and tree(source.resolve().parent) == versions


def test_a_killed_conversion_leaves_only_a_partial_folder(reach, tmp_path):
    source = reach["dataset"]
    before = tree(source.resolve().parent)
    out = tmp_path / "v21"
    argv = demoforge_argv("convert", str(source), "--format", "lerobot-v2.1", "--out", str(out))
    for step in ("after_videos", "before_publish"):  # inside the writer, then with everything written
        kill_at_step(argv, step, tmp_path / f"reached-{step}")
        assert not out.exists() and not out.is_symlink()
    partials = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("v21"))
    assert len(partials) == 2 and all(name.startswith("v21.partial-") for name in partials), partials
    assert tree(source.resolve().parent) == before  # the dataset (and its export lock) as it was
    result = run_cli("convert", str(source), "--format", "lerobot-v2.1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 2
