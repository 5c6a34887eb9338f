"""``demoforge rerender``: recorded episodes re-simulated into a new dataset with other observations; every
non-video column byte-identical, new cameras loadable by LeRobot, variants that differ only in appearance,
resumable after a kill, and everything that could change the physics refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from demoforge.storage.episode_source import open_episode_source
from demoforge.storage.lerobot.format import read_sidecar
from edit_helpers import violations
from helpers import attempt_marks_of, attempts_mid_episode, cli_env, demoforge_argv, kill_once_started, run_cli

pytestmark = pytest.mark.slow  # subprocess jobs of real simulators (the quick tier, -m "not slow", skips them)

PUSH = ("--task", "metaworld-push-v3", "--option", "image_size=48", "--option", "shadows=false",
        "--option", "antialias=false")  # fast on CPU


@pytest.fixture(scope="module")
def push_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerender")
    done = run_cli("generate", *PUSH, "--episodes", "2", "--seed", "3", "--store", str(root / "s"),
                   "--export", str(root / "d"))
    assert done.returncode == 0, done.stderr
    return root


def table(dataset: Path):
    files = sorted(dataset.glob("data/chunk-*/file-*.parquet"))
    assert len(files) == 1
    return pq.read_table(files[0])


def sidecar(dataset: Path) -> list[dict]:
    return read_sidecar(dataset)


def frames_of(dataset: Path, camera: str) -> list[list[np.ndarray]]:
    source = open_episode_source(dataset)
    try:
        return [source.camera_frames(source.load(ref), camera) for ref in source.episodes()]
    finally:
        source.close()


def test_new_sizes_cameras_and_variants_with_every_other_column_byte_identical(push_run, tmp_path) -> None:
    """One rerender (worker processes) at another size, with two cameras and two appearance variants: every
    non-video column of each variant equals its source episode's, the new cameras load with both of LeRobot's
    video backends, the variants differ in pixels, and replay draws a variant's scene again and reproduces it
    (images included)."""
    out = tmp_path / "r"
    done = run_cli("rerender", str(push_run / "d"), "--out", str(out), "--option", "image_size=64",
                   "--camera", "corner2", "--camera", "topview", "--randomize", "lighting,colors", "--variants", "2",
                   "--executor", "process")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rerendered 4/4 episodes" in done.stdout
    source, new = table(push_run / "d"), table(out)
    assert source.column_names == new.column_names  # cameras are videos, not columns
    episodes, source_episodes = np.asarray(new["episode_index"]), np.asarray(source["episode_index"])
    for column in source.column_names:
        if column in ("episode_index", "index", "timestamp", "frame_index", "task_index"):
            continue
        values, original = new[column].to_pylist(), source[column].to_pylist()
        for index in range(4):
            got = [v for v, e in zip(values, episodes) if e == index]
            assert got == [v for v, e in zip(original, source_episodes) if e == index // 2], (column, index)
    features = json.loads((out / "meta/info.json").read_text())["features"]
    for camera in ("corner2", "topview"):
        assert features[f"observation.images.{camera}"]["shape"][:2] == [64, 64]
    assert "observation.image" not in features
    records = sidecar(out)
    assert [r["seed"] for r in records] == [r["seed"] for r in sidecar(push_run / "d") for _ in range(2)]
    assert [r["randomization"].get("variant", 0) for r in records] == [0, 1, 0, 1]
    assert records[0]["randomization"] != records[1]["randomization"]
    pictures = frames_of(out, "corner2")
    assert np.abs(pictures[0][0].astype(int) - pictures[1][0]).mean() > 2  # two looks at one scene
    assert violations(out, backends=("pyav", "torchcodec")) == []
    replay = run_cli("replay", str(out), "--images", "--episodes", "1", "--json")  # a variant other than 0
    assert replay.returncode == 0, replay.stdout + replay.stderr


def test_a_killed_rerender_resumes_and_publishes_each_episode_once(push_run, tmp_path) -> None:
    out, store = tmp_path / "k", tmp_path / "k.store"
    argv = demoforge_argv("rerender", str(push_run / "d"), "--out", str(out), "--option", "image_size=56")
    # Killed while an episode is being rerendered (its first frames written, its end not yet).
    killed = kill_once_started(argv, lambda: bool(attempts_mid_episode(store)), 0,
                               env=cli_env(DEMOFORGE_ATTEMPT_MARKS=str(attempt_marks_of(store))))
    assert killed and not out.exists()
    done = run_cli("rerender", str(push_run / "d"), "--out", str(out), "--option", "image_size=56")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["seed"] for r in sidecar(out)] == [r["seed"] for r in sidecar(push_run / "d")]
    assert table(out)["observation.state"].equals(table(push_run / "d")["observation.state"])
    # Its own dataset now exists at --out: the same command again is a re-run, not a write into another dataset.
    again = run_cli("rerender", str(push_run / "d"), "--out", str(out), "--option", "image_size=56")
    assert again.returncode == 0 and "nothing new to export" in again.stdout, again.stdout + again.stderr


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its file's size and mtime (SQLite's shared-memory files, which a reader of a
    store creates, left out)."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) if p.is_file() else (0, 0)
            for p in sorted(root.rglob("*")) if not p.name.endswith(("-shm", "-wal"))}


def test_an_output_that_is_not_a_new_dataset_is_refused_before_anything_is_rendered(push_run, tmp_path) -> None:
    """--out (or --store) the source, inside it, around it, an existing dataset this rerender did not write, a
    non-empty folder: one line, exit 2, and nothing written anywhere (no OUT.store left behind)."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    source, store = push_run / "d", push_run / "s"
    cases = [((str(source), "--out", str(source)), "is the source"),
             ((str(source), "--out", str(source / "inner")), "is inside the source"),
             ((str(store), "--out", str(source)), "already holds a dataset that this rerender's store"),
             ((str(source), "--out", str(tmp_path / "full")), "is a non-empty directory"),
             ((str(store), "--out", str(tmp_path / "new"), "--store", str(store)), "--store")]
    before, mine = tree(push_run), tree(tmp_path)
    for args, message in cases:
        done = run_cli("rerender", *args, "--codec", "h264")
        assert done.returncode == 2, (args, done.stdout + done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        assert tree(push_run) == before and tree(tmp_path) == mine, args


def test_a_diverging_episode_is_reported_and_never_written(tmp_path) -> None:
    store = tmp_path / "noisy"
    assert run_cli("generate", "--task", "toy-noisy", "--codec", "h264", "--option", "steps=6", "--episodes", "2",
                   "--store", str(store)).returncode == 0
    done = run_cli("rerender", str(store), "--out", str(tmp_path / "r"), "--codec", "h264")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("not rerendered: episode") == 2 and "diverged from the source at frame" in done.stdout
    assert "Traceback" not in done.stderr and not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, message", [
    (("--randomize", "physics"), "rerender may add appearance axes only"),
    (("--option", "max_steps=100"), "option 'max_steps' of 'metaworld-push-v3' is not appearance"),
    (("--variants", "3"), "--variants needs an appearance axis"),
    (("--option", "image_size=5000"), "image_size"),
])
def test_changes_that_are_not_appearance_are_refused(push_run, tmp_path, args, message) -> None:
    out = tmp_path / "x"
    done = run_cli("rerender", str(push_run / "d"), "--out", str(out), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists() and not (tmp_path / "x.store").exists()


def test_sources_that_cannot_be_rerendered_are_refused(tmp_path) -> None:
    noisy = tmp_path / "n"
    assert run_cli("generate", "--task", "metaworld-push-v3", "--option", "camera=none", "--episodes", "1",
                   "--noise", "gaussian:0.1", "--store", str(noisy)).returncode == 0
    done = run_cli("rerender", str(noisy), "--out", str(tmp_path / "r"))
    assert done.returncode == 2 and "driven by noise or a policy" in done.stderr, done.stderr
    missing = run_cli("rerender", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    assert not (tmp_path / "r").exists()


def test_a_source_recorded_with_other_simulator_versions_is_refused_naming_them(push_run, tmp_path) -> None:
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(push_run / "d", copy)
    sidecar_file = copy / "meta/demoforge_episodes.jsonl"
    records = [json.loads(line) for line in sidecar_file.read_text().splitlines()]
    records[1]["versions"]["mujoco"] = "3.0.0"
    sidecar_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = run_cli("rerender", str(copy), "--out", str(tmp_path / "r"))
    assert done.returncode == 2 and "other library versions (mujoco 3.0.0 -> " in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


def test_a_task_whose_planner_changes_the_env_rerenders_with_depth_added(tmp_path) -> None:
    """fetch-pick-place places each cycle's goal as it plans it: rerender walks the task's own plan in step with
    the recorded actions, so the goal (a recorded state) is where it was."""
    store, out = tmp_path / "s", tmp_path / "r"
    done = run_cli("generate", "--task", "fetch-pick-place", "--option", "cycles=1", "--option", "image_size=48",
                   "--episodes", "2", "--store", str(store), "--export", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    done = run_cli("rerender", str(store), "--out", str(out), "--depth")
    assert done.returncode == 0, done.stdout + done.stderr
    source, new = table(tmp_path / "d"), table(out)
    for column in source.column_names:
        assert new[column].equals(source[column]), column
    features = json.loads((out / "meta/info.json").read_text())["features"]
    assert "observation.images.front_depth" in features and "observation.images.front" in features


def test_reactive_experts_see_each_recorded_segment_end_as_they_did(tmp_path) -> None:
    """Meta-World's reactive expert ends a segment when, asked for one more action, it finds its phase changed:
    rerender asks it as the executor did (pick-place's validators refused every episode otherwise)."""
    store, out = tmp_path / "s", tmp_path / "r"
    done = run_cli("generate", "--task", "metaworld-pick-place-v3", "--option", "camera=none", "--episodes", "2",
                   "--store", str(store), "--export", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    done = run_cli("rerender", str(store), "--out", str(out), "--option", "camera=corner2", "--option",
                   "image_size=32", "--option", "shadows=false")
    assert done.returncode == 0, done.stdout + done.stderr
    assert table(out)["observation.state"].equals(table(tmp_path / "d")["observation.state"])
