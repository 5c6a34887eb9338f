"""`demoforge verify DATASET`: published files are checked against the checksums the export recorded; `demoforge
validate`: a valid LeRobot v3.0 dataset told apart from demoforge's annotations, and what makes one invalid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli


def test_verify_dataset_reports_changed_missing_and_extra_files(tmp_path: Path) -> None:
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    made = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "2",
                   "--store", str(store), "--export", str(dataset))
    assert made.returncode == 0, made.stderr
    more = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "3",
                   "--store", str(store), "--export", str(dataset))  # a second version: hard-linked files too
    assert more.returncode == 0, more.stderr
    good = run_cli("verify", str(dataset), "--json")
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads(good.stdout)
    assert report["ok"] and report["version"] == "v000002" and report["checked"] >= 8
    assert report["decoded_frames"] >= 3

    current = dataset.resolve()
    parquet = sorted(current.glob("data/**/*.parquet"))[0]
    video = sorted(current.glob("videos/**/*.mp4"))[-1]
    for path in (parquet, video):  # a flipped byte, written without touching the other version's hard link
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.unlink()
        path.write_bytes(bytes(data))
    info = current / "meta" / "info.json"
    info.unlink()
    (current / "meta" / "notes.txt").write_text("added by hand")

    bad = run_cli("verify", str(dataset))
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    for path, problem in ((parquet, "changed: sha256 differs"), (video, "changed: sha256 differs"),
                          (info, "missing"), (current / "meta" / "notes.txt", "extra")):
        rel = path.relative_to(current)
        assert any(f"{dataset / rel}: {problem}" in line for line in lines), (rel, bad.stdout)
    assert "Traceback" not in bad.stderr

    neither = run_cli("verify")
    assert neither.returncode != 0 and "one of them" in neither.stderr


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """Two episodes written by LeRobot's own writer: a valid v3.0 dataset without demoforge's annotations."""
    import recorder_loop as loop

    return loop.lerobot_record(tmp_path_factory.mktemp("lerobot") / "recording", range(2))


def test_validate_tells_a_valid_lerobot_dataset_from_demoforges_annotations(recording: Path) -> None:
    done = run_cli("validate", str(recording), HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "as a LeRobot v3.0 dataset: valid" in done.stdout and "demoforge's annotations: absent" in done.stdout
    expected = run_cli("validate", str(recording), "--expect-segments", "2", "--json", HF_HUB_OFFLINE="1")
    assert expected.returncode == 1, expected.stdout + expected.stderr
    report = json.loads(expected.stdout)
    assert report["lerobot_v3"] == "valid" and report["demoforge_annotations"] == "absent"
    assert any("has no segment annotations" in p for p in report["problems"]), report["problems"]


def test_validate_fails_non_finite_statistics_and_an_episode_held_twice(recording: Path, tmp_path: Path) -> None:
    import shutil

    import recorder_loop as loop

    from demoforge.storage.lerobot.validate import validate_dataset

    nan = tmp_path / "nan"
    shutil.copytree(recording, nan)
    stats = json.loads((nan / "meta/stats.json").read_text())
    stats["action"]["std"][0] = float("nan")
    (nan / "meta/stats.json").write_text(json.dumps(stats))  # Python writes the NaN token LeRobot's loader reads
    report = validate_dataset(nan, sample_frames=1)
    assert report.status == 1 and any("action std (nan)" in p for p in report.problems), report.problems

    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    twice = LeRobotDataset.create("local/twice", fps=30, features=loop.FEATURES, root=tmp_path / "twice",
                                  use_videos=True, rgb_encoder=RGBEncoderConfig(vcodec="h264"))
    for episode in (0, 1, 0):  # episode 0 recorded again as episode 2
        for step in range(loop.length(episode)):
            twice.add_frame(loop.frame(episode, step))
        twice.save_episode()
    twice.finalize()
    report = validate_dataset(tmp_path / "twice", sample_frames=1)
    assert report.status == 1 and "episode 2 is episode 0 again" in " ".join(report.problems), report.problems


def test_episodes_alike_from_different_seeds_are_not_duplicates(tmp_path: Path) -> None:
    """The toy task starts at seed mod 7: of 8 episodes two are alike frame for frame, yet each is its own."""
    from demoforge.storage.lerobot.validate import validate_dataset

    made = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=4", "--episodes", "8",
                   "--store", str(tmp_path / "store"), "--export", str(tmp_path / "dataset"))
    assert made.returncode == 0, made.stderr
    report = validate_dataset(tmp_path / "dataset", sample_frames=1)
    assert report.status == 0, report.problems
