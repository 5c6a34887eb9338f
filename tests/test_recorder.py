"""The durable Recorder: LeRobot's call shape (create, add_frame, save_episode, discard_episode, close) over the
pipeline's own stages, for recording loops demoforge does not drive.

The same frames go through the Recorder and through LeRobot 0.6.1's own writer; the two datasets load with the
real LeRobotDataset (both video backends) and agree in features, rows, statistics and pixels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pyarrow.parquet as pq
import pytest

import recorder_loop as loop
from demoforge import Recorder
from demoforge.pipeline.recorder import FrameError, RecorderClosedError, RecorderError, RecorderMismatchError
from edit_helpers import violations
from helpers import REPO, cli_env, psnr

pytestmark = pytest.mark.slow
USER_KEYS = ("observation.state", "action", loop.CAMERA)


def rows(dataset: Path):
    return pq.read_table(sorted((dataset / "data").glob("*/*.parquet"))).to_pandas()


def record(root: Path, episodes: range, **kwargs) -> Recorder:
    recorder = Recorder.create(root, fps=30, features=loop.FEATURES, codec="h264", **kwargs)
    for episode in episodes:
        for step in range(loop.length(episode)):
            recorder.add_frame(loop.frame(episode, step))
        assert recorder.save_episode() == episode
    return recorder


def decoded(dataset: Path, backend: str) -> list[np.ndarray]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/x", root=dataset, video_backend=backend)
    return [(ds[i][loop.CAMERA].numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8) for i in range(len(ds))]


def test_the_recorder_writes_what_lerobots_writer_writes(tmp_path: Path) -> None:
    record(tmp_path / "ours", range(2)).close()
    reference = loop.lerobot_record(tmp_path / "theirs", range(2))
    ours = tmp_path / "ours"
    assert violations(ours, backends=("pyav", "torchcodec")) == []
    info, theirs_info = (json.loads((d / "meta/info.json").read_text()) for d in (ours, reference))
    for key in USER_KEYS:
        for field in ("dtype", "shape", "names"):
            assert info["features"][key][field] == theirs_info["features"][key][field], (key, field)
    assert info["fps"] == 30 and info["total_episodes"] == 2
    a, b = rows(ours), rows(reference)
    for column in ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert [np.asarray(v).tolist() for v in a[column]] == [np.asarray(v).tolist() for v in b[column]], column
    stats, theirs_stats = (json.loads((d / "meta/stats.json").read_text()) for d in (ours, reference))
    for key in USER_KEYS:
        for name, value in theirs_stats[key].items():
            np.testing.assert_allclose(stats[key][name], value, rtol=1e-5, atol=1e-6, err_msg=f"{key} {name}")
    # pixels: as close to the frames as LeRobot's own encode of them (same codec settings), with both backends
    truth = [loop.frame(e, s)[loop.CAMERA] for e in range(2) for s in range(loop.length(e))]
    theirs = decoded(reference, "pyav")
    baseline = min(psnr(p, t) for p, t in zip(theirs, truth))
    for backend in ("pyav", "torchcodec"):
        pictures = decoded(ours, backend)
        assert len(pictures) == len(truth)
        assert min(psnr(p, t) for p, t in zip(pictures, truth)) > baseline - 1.0, backend
        assert min(psnr(p, t) for p, t in zip(pictures, theirs)) > 28, backend
    tasks = pq.read_table(ours / "meta/tasks.parquet").to_pandas()
    assert list(tasks.index) == [loop.TASK]


def test_discard_leaves_no_trace_and_a_reopened_root_continues_numbering(tmp_path: Path) -> None:
    root = tmp_path / "d"
    recorder = record(root, range(1))
    for step in range(5):
        recorder.add_frame(loop.frame(1, step))
    recorder.discard_episode()
    for step in range(3):  # left in progress at close: discarded too
        recorder.add_frame(loop.frame(1, step))
    recorder.close()
    assert rows(root)["episode_index"].tolist() == [0] * loop.length(0)
    staged = sorted(p.name for p in (tmp_path / "d.store" / "staging.zarr" / "episodes").iterdir() if p.is_dir())
    assert staged == ["ep00000000-a00"], staged  # the discarded attempts' folders are gone
    reopened = Recorder.create(root, fps=30, features=loop.FEATURES, codec="h264")
    assert reopened.episode_index == 1
    for step in range(loop.length(1)):
        reopened.add_frame(loop.frame(1, step))
    assert reopened.save_episode() == 1
    reopened.close()
    table = rows(root)
    assert table["episode_index"].tolist() == [0] * loop.length(0) + [1] * loop.length(1)
    expected = [loop.frame(e, s)["observation.state"].tolist() for e in range(2) for s in range(loop.length(e))]
    assert [v.tolist() for v in table["observation.state"]] == expected


def test_segments_become_annotations_and_the_episode_record(tmp_path: Path) -> None:
    root = tmp_path / "d"
    recorder = Recorder.create(root, fps=30, features=loop.FEATURES, codec="h264")
    names = ["reach"] * 4 + ["grasp"] * 3 + ["lift"] * 5
    for step, name in enumerate(names):
        recorder.add_frame(loop.frame(0, step), segment=name, instruction=f"{name} the block", reward=float(step))
    recorder.save_episode()
    recorder.close()
    table = rows(root)
    assert table["annotation.segment_id"].tolist() == [0] * 4 + [1] * 3 + [2] * 5
    assert table["annotation.segment_end"].tolist() == [0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1]
    assert table["next.reward"].tolist() == [float(s) for s in range(12)]
    assert table["next.done"].tolist()[-1] and table["next.success"].tolist()[-1]
    record_ = json.loads((root / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()[0])
    assert [(s["name"], s["start_step"], s["end_step"], s["instruction"]) for s in record_["segments"]] == [
        ("reach", 0, 4, "reach the block"), ("grasp", 4, 7, "grasp the block"), ("lift", 7, 12, "lift the block")]


def test_publish_every_k_saves_and_at_close(tmp_path: Path) -> None:
    root = tmp_path / "d"
    recorder = record(root, range(1), publish=2)
    assert not root.exists()  # one save of two: not yet published
    for step in range(loop.length(1)):
        recorder.add_frame(loop.frame(1, step))
    recorder.save_episode()
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 2
    for step in range(loop.length(2)):
        recorder.add_frame(loop.frame(2, step))
    recorder.save_episode()
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 2
    recorder.close()
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 3


def test_an_async_loop_records_through_the_async_methods(tmp_path: Path) -> None:
    async def main() -> int:
        recorder = Recorder.create(tmp_path / "d", fps=30, features=loop.FEATURES, codec="h264")
        for step in range(loop.length(0)):
            await recorder.add_frame_async(loop.frame(0, step))
        index = await recorder.save_episode_async()
        await recorder.close_async()
        return index

    assert anyio.run(main) == 0
    assert len(rows(tmp_path / "d")) == loop.length(0)


def _with(key: str, value) -> dict:
    frame = loop.frame(0, 0)
    frame[key] = value
    return frame


@pytest.mark.parametrize("frame, error, message", [
    (_with("observation.state", np.zeros(5, np.float32)), FrameError, r"frame\['observation.state'\]: expected shape \(6,\), got \(5,\)"),
    (_with("action", np.array(["a"] * 6)), FrameError, r"frame\['action'\]: expected numbers"),
    (_with(loop.CAMERA, np.zeros((48, 64, 3), np.float32)), FrameError, r"uint8 array of shape \(48, 64, 3\)"),
    (_with("task", ""), FrameError, r"frame\['task'\]"),
    ({k: v for k, v in loop.frame(0, 0).items() if k != "action"}, FrameError, r"missing \['action'\]"),
    (_with("observation.velocity", np.zeros(3)), FrameError, r"not in the features \['observation.velocity'\]"),
    (_with("action", np.full(6, np.nan, np.float32)), FrameError, "NaN"),
])
def test_bad_frames_are_refused_by_name_and_the_episode_goes_on(tmp_path: Path, frame, error, message) -> None:
    with Recorder.create(tmp_path / "d", fps=30, features=loop.FEATURES, codec="h264") as recorder:
        recorder.add_frame(loop.frame(0, 0))
        with pytest.raises(error, match=message):
            recorder.add_frame(frame)
        recorder.add_frame(loop.frame(0, 1))
        recorder.save_episode()
    assert rows(tmp_path / "d")["frame_index"].tolist() == [0, 1]


def test_bad_features_calls_and_another_recordings_root_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RecorderError, match="'action' feature"):
        Recorder.create(tmp_path / "x", fps=30, features={"observation.state": loop.FEATURES["observation.state"]})
    with pytest.raises(RecorderError, match="feature 'next.done': demoforge writes this column itself"):
        Recorder.create(tmp_path / "x", fps=30, features={**loop.FEATURES, "next.done": {"dtype": "bool",
                                                                                           "shape": (1,)}})
    with pytest.raises(RecorderError, match="dtype 'int64' is not recorded"):
        Recorder.create(tmp_path / "x", fps=30, features={**loop.FEATURES, "count": {"dtype": "int64",
                                                                                       "shape": (1,)}})
    root = tmp_path / "d"
    recorder = record(root, range(1))
    with pytest.raises(RecorderError, match="no frame was added"):
        recorder.save_episode()
    recorder.close()
    with pytest.raises(RecorderClosedError):
        recorder.add_frame(loop.frame(1, 0))
    before = {p: p.read_bytes() for p in sorted(root.resolve().rglob("*")) if p.is_file()}
    other: dict[str, Any] = {**loop.FEATURES, "action": {"dtype": "float32", "shape": (7,), "names": None}}
    with pytest.raises(RecorderMismatchError, match="other settings"):
        Recorder.create(root, fps=30, features=other, codec="h264")
    with pytest.raises(RecorderMismatchError):
        Recorder.create(root, fps=15, features=loop.FEATURES, codec="h264")
    (tmp_path / "someone_elses").mkdir()
    with pytest.raises(RecorderMismatchError, match="no recorder staged it"):
        Recorder.create(tmp_path / "someone_elses", fps=30, features=loop.FEATURES, codec="h264")
    assert not (tmp_path / "someone_elses.store").exists()
    assert {p: p.read_bytes() for p in sorted(root.resolve().rglob("*")) if p.is_file()} == before


def test_a_loop_killed_at_random_moments_loses_at_most_its_episode_in_progress(tmp_path: Path) -> None:
    """SIGKILL a recording loop (its own process) three times, each once a chosen number of saves returned and
    a few frames into the next; every episode whose save_episode returned is in the dataset after the next run,
    exactly, and the last run finishes the target."""
    root, target = tmp_path / "d", 7
    argv = [sys.executable, str(REPO / "tests" / "recorder_loop.py"), str(root), str(target)]
    saved: list[int] = []
    rng = np.random.default_rng(5)
    for _kill in range(3):
        proc = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stderr is not None
        for _ in range(int(rng.integers(1, 3))):
            line = proc.stdout.readline()
            assert line.startswith("saved "), (line, proc.stderr.read())
            saved.append(int(line.split()[1]))
        os.kill(proc.pid, signal.SIGKILL)  # at once: inside the next episode's frames or its save
        proc.wait()
        saved += [int(line.split()[1]) for line in proc.stdout.read().splitlines()]  # printed before the kill
    done = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    saved += [int(line.split()[1]) for line in done.stdout.splitlines()]
    assert len(saved) == len(set(saved)) and set(saved) <= set(range(target))  # none saved twice
    table = rows(root)  # every episode once, in order, exactly as its loop made it
    assert table["episode_index"].tolist() == [e for e in range(target) for _ in range(loop.length(e))]
    expected = [loop.frame(e, s)["observation.state"].tolist() for e in range(target) for s in range(loop.length(e))]
    assert [v.tolist() for v in table["observation.state"]] == expected
    assert violations(root) == []


def test_the_recorder_pages_examples_run_and_resume(tmp_path: Path) -> None:
    """docs/recorder.md's teleoperation and policy-rollout loops, as written, each from a fresh process in a
    scratch folder; the teleoperation loop run again adds nothing (it resumes at its target)."""
    import re

    teleop, rollout = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "recorder.md").read_text(), flags=re.S)
    for block, printed in ((teleop, "saved episode 2"), (rollout, "saved rollout 1"), (teleop, "")):
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=cli_env(HF_HUB_OFFLINE="1"),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert printed in done.stdout and (printed or "saved" not in done.stdout)
    for name, episodes in (("reacher-teleop", 3), ("reacher-rollouts", 2)):
        assert json.loads((tmp_path / "runs" / name / "meta" / "info.json").read_text())["total_episodes"] == episodes


def test_a_bad_instruction_or_names_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Issue 57: ``instruction=12345`` was committed, then every save, close, reopen and export raised a raw
    ArrowTypeError; names of the wrong length were dropped silently."""
    from demoforge.pipeline.recorder import MAX_TEXT_CHARS

    short: dict[str, Any] = {**loop.FEATURES, "action": {"dtype": "float32", "shape": (6,), "names": ["a", "b", "c"]}}
    with pytest.raises(RecorderError, match=r"feature 'action': 'names' must be None or 6 distinct"):
        Recorder.create(tmp_path / "n", fps=30, features=short, codec="h264")
    flat: dict[str, Any] = {**loop.FEATURES,
                            "observation.state": {"dtype": "float32", "shape": (2, 3), "names": ["x", "y"]}}
    with pytest.raises(RecorderError, match=r"feature 'observation.state': names are recorded for 1-D features"):
        Recorder.create(tmp_path / "n", fps=30, features=flat, codec="h264")
    assert not any(tmp_path.iterdir())
    root = tmp_path / "d"
    with Recorder.create(root, fps=30, features=loop.FEATURES, codec="h264") as recorder:
        recorder.add_frame(loop.frame(0, 0), instruction="reach")
        bad: Any
        for bad in (12345, b"reach", "", "x" * (MAX_TEXT_CHARS + 1)):
            with pytest.raises(FrameError, match=f"instruction: expected a non-empty string of at most "
                                                 f"{MAX_TEXT_CHARS} characters"):
                recorder.add_frame(loop.frame(0, 1), segment="grasp", instruction=bad)
        with pytest.raises(FrameError, match=r"frame\['task'\].*at most 1000 characters, got 1001 characters"):
            recorder.add_frame(_with("task", "t" * 1001))
        recorder.add_frame(loop.frame(0, 1), segment="grasp", instruction="g" * MAX_TEXT_CHARS)
        recorder.save_episode()
    record_ = json.loads((root / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()[0])
    assert [s["instruction"] for s in record_["segments"]] == ["reach", "g" * MAX_TEXT_CHARS]


def test_a_root_an_older_recorder_bricked_with_a_number_instruction_reopens_and_exports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Recorder before the check committed (``instruction=12345`` in the episode record) publishes: the
    root reopens, goes on, and ``demoforge export`` of its store succeeds."""
    import demoforge.pipeline.recorder as recorder_module
    from helpers import run_cli

    root = tmp_path / "d"
    with monkeypatch.context() as patch:
        patch.setattr(recorder_module, "_text", lambda what, value: None)  # the older recorder: no check
        old = Recorder.create(root, fps=30, features=loop.FEATURES, codec="h264", publish="close")
        for step in range(3):
            old.add_frame(loop.frame(0, step), instruction=12345)  # type: ignore[arg-type]
        old.save_episode()
        old._shutdown()  # ended as the failed close left it: committed, never published
    assert not root.exists()
    reopened = Recorder.create(root, fps=30, features=loop.FEATURES, codec="h264")
    assert reopened.episode_index == 1
    for step in range(2):
        reopened.add_frame(loop.frame(1, step))
    reopened.save_episode()
    reopened.close()
    assert rows(root)["episode_index"].tolist() == [0, 0, 0, 1, 1]
    assert rows(root)["language_persistent"].tolist()[0][0]["content"] == "12345"
    done = run_cli("export", "--store", str(tmp_path / "d.store"), "--out", str(tmp_path / "again"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "again" / "meta" / "info.json").read_text())["total_episodes"] == 2
