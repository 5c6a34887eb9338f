"""LeRobot v3.0 export: round trip through the real lerobot package, incremental exports, crashes, bad input."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

import toy_tasks  # noqa: F401
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.lerobot.export import NotOurDatasetError, SchemaMismatchError, ExportError, export_store
from demoforge.storage.lerobot.validate import validate_dataset
from demoforge.storage.store import open_store
from helpers import decode_frames, demoforge_argv, kill_at_step, psnr, read_row, run_cli

pytestmark = pytest.mark.slow
OPTIONS = {"steps": 24, "size": 48}


def generate(store, episodes, **kw):
    spec = JobSpec(task="toy-point", episodes=episodes, task_options=kw.pop("options", OPTIONS),
                   video=kw.pop("video", VideoSettings(codec="h264")), **kw)
    return run_job(spec, store)


def load(root, backend="pyav", **kw):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/test", root=root, video_backend=backend, **kw)


def tree_digest(root):
    """Every file of the published version, by relative path, hashed (follows the version link)."""
    base = root.resolve()
    return {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*")) if p.is_file()}


def staged_rows(store):
    with open_store(store) as view:
        _fingerprint, staging = view.require_job()
        rows = view.attempts(("committed", "exported"))
        return [(r, read_row(staging, r)) for r in rows]


@pytest.mark.parametrize("backend", ["pyav", "torchcodec"])
@pytest.mark.parametrize("codec", ["h264", "libsvtav1"])
def test_round_trip_through_lerobot(tmp_path, backend, codec):
    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 3, video=VideoSettings(codec=codec))
    report = export_store(store, out)
    assert report.exported == 3 and report.total_frames == 72
    dataset = load(out, backend)
    assert len(dataset) == 72 and dataset.num_episodes == 3
    assert dataset.meta.video_keys == ["observation.images.cam"]
    for index, (row, staged) in enumerate(staged_rows(store)):
        rendered = decode_frames(staged.video["cam"])  # the staged stream itself, decoded
        from_ = int(dataset.meta.episodes[index]["dataset_from_index"])
        for t in range(row.frames):
            item = dataset[from_ + t]
            assert int(item["episode_index"]) == index and int(item["frame_index"]) == t
            np.testing.assert_array_equal(item["observation.state"].numpy(), staged.state["observation.state"][t])
            np.testing.assert_array_equal(item["action"].numpy().reshape(-1), staged.action[t])
            for k, key in enumerate(("valid", "episode_step", "segment_id", "segment_step", "segment_start",
                                     "segment_end", "terminated", "truncated")):
                assert int(item[f"annotation.{key}"]) == staged.annotations[t, k]
            image = (item["observation.images.cam"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            # Remuxing does not re-encode: the decoded frame is the staged one (up to float rounding).
            assert psnr(image, rendered[t]) > 45
        segments = item["language_persistent"]
        assert [s["content"] for s in segments] == ["approach", "retreat"]
    assert validate_dataset(out, video_backend=backend, expect_segments=2).status == 0


def test_decoded_frames_match_the_rendered_ones(tmp_path):
    """Against the env's own images (not the staged stream): the codec's loss stays within a stated PSNR."""
    from demoforge.stages.executor import run_episodes
    from demoforge.stages.records import Frame
    from demoforge.pipeline.tasks.registry import get_task

    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 1, video=VideoSettings())  # LeRobot's default AV1 settings
    export_store(store, out)
    env = get_task("toy-point").build(OPTIONS)
    frames = [r for r in run_episodes(env, task="toy-point", episodes=1) if isinstance(r, Frame)]
    dataset = load(out, "torchcodec")
    worst = min(psnr((dataset[t]["observation.images.cam"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8),
                     f.images["cam"]) for t, f in enumerate(frames))
    assert worst > 30, f"worst PSNR {worst:.1f} dB"


def test_delta_timestamps_chunks_cross_segment_boundaries(tmp_path):
    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 2)
    export_store(store, out)
    fps = 10
    chunk = [i / fps for i in range(8)]
    dataset = load(out, delta_timestamps={"action": chunk, "annotation.segment_id": chunk,
                                          "observation.images.cam": [0.0, 0.3]})
    # Frame 8 of episode 0: the 8-frame chunk crosses the boundary between segment 0 (12 frames) and 1.
    item = dataset[8]
    assert item["annotation.segment_id"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert item["observation.images.cam"].shape == (2, 3, 48, 48)
    # Near the episode's end the chunk is padded, never read from the next episode.
    last = dataset[23]
    assert last["action_is_pad"].tolist() == [False] + [True] * 7


def test_two_exports_append_and_a_third_changes_nothing(tmp_path):
    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 5)
    first = export_store(store, out)
    assert (first.exported, first.total_episodes) == (5, 5)
    v1 = tree_digest(out)
    generate(store, 10)
    second = export_store(store, out)
    assert (second.exported, second.total_episodes, second.total_frames) == (5, 10, 240)
    v2 = tree_digest(out)
    # New episodes went to new files; every data/video file of the first export is unchanged.
    for path, digest in v1.items():
        if path.startswith(("data/", "videos/", "meta/episodes/")):
            assert v2[path] == digest, path
    assert len([p for p in v2 if p.startswith("videos/")]) == 2
    dataset = load(out)
    assert dataset.num_episodes == 10 and len(dataset) == 240
    assert sorted(set(int(i) for i in dataset.hf_dataset["episode_index"])) == list(range(10))
    assert validate_dataset(out, expect_segments=2).status == 0
    third = export_store(store, out)
    assert third.exported == 0 and tree_digest(out) == v2
    sidecar = [json.loads(line) for line in (out / "meta" / "demoforge_episodes.jsonl").read_text().splitlines()]
    assert [r["dataset_episode_index"] for r in sidecar] == list(range(10))
    assert [r["staging_episode_index"] for r in sidecar] == list(range(10))
    assert all(r["success"] and r["schema_version"] == 1 for r in sidecar)
    with open_store(store) as view:
        assert [r.dataset_index for r in view.attempts(("exported",))] == list(range(10))


def test_the_same_store_exports_to_the_same_bytes(tmp_path):
    """Two exports of one store, in two processes with different hash seeds, are byte-identical file for file
    (LeRobot gathers stats.json's features in a set: its order changed from process to process)."""
    store = tmp_path / "store"
    generate(store, 2)
    trees = []
    for seed in ("1", "2"):
        out = tmp_path / f"dataset-{seed}"
        done = run_cli("export", "--store", str(store), "--out", str(out), PYTHONHASHSEED=seed)
        assert done.returncode == 0, done.stderr
        trees.append(tree_digest(out))
    assert trees[0] == trees[1] and any(path == "meta/stats.json" for path in trees[0])


def test_sigkill_at_each_step_of_an_export_leaves_the_previous_or_the_new_dataset(tmp_path):
    """Killed at every step of building a version (each kill lands when the export's hook says it is there),
    the published dataset is the previous one, loads and validates; killed once it is published and before the
    catalog records it, the new one; the next export finishes the job without duplicates or leftovers."""
    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 3)
    assert run_cli("export", "--store", str(store), "--out", str(out)).returncode == 0
    generate(store, 6)
    argv = demoforge_argv("export", "--store", str(store), "--out", str(out))
    for step in ("after_links", "after_videos", "after_data", "before_fsync", "before_publish", "before_catalog"):
        kill_at_step(argv, step, tmp_path / f"reached-{step}")
        dataset = load(out)  # the published dataset always loads
        expected = 6 if step == "before_catalog" else 3
        assert dataset.num_episodes == expected, (step, dataset.num_episodes)
        assert validate_dataset(out).status == 0, step
    final = run_cli("export", "--store", str(store), "--out", str(out))
    assert final.returncode == 0, final.stderr
    dataset = load(out)
    assert dataset.num_episodes == 6 and len(dataset) == 6 * 24
    assert not list((tmp_path / "dataset.versions").glob("*.partial"))
    assert validate_dataset(out, expect_segments=2).status == 0
    with open_store(store) as opened:  # the catalog caught up: every episode exported once, in order
        assert [r.dataset_index for r in opened.attempts(("exported",))] == list(range(6))


def test_foreign_and_mismatched_targets_are_refused_untouched(tmp_path):
    store = tmp_path / "store"
    generate(store, 1)
    # A LeRobot dataset that demoforge did not write.
    foreign = tmp_path / "foreign"
    (foreign / "meta").mkdir(parents=True)
    (foreign / "meta" / "info.json").write_text('{"codebase_version": "v3.0"}')
    with pytest.raises(NotOurDatasetError, match="not written by demoforge"):
        export_store(store, foreign)
    assert [p.name for p in foreign.rglob("*")] == ["meta", "info.json"]
    # An unrelated non-empty directory.
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"meow")
    result = run_cli("export", "--store", str(store), "--out", str(other))
    assert result.returncode == 2 and "non-empty directory" in result.stderr
    assert [p.name for p in other.iterdir()] == ["cat.jpg"]
    # A demoforge dataset of another job (different camera size).
    out = tmp_path / "dataset"
    export_store(store, out)
    before = tree_digest(out)
    store2 = tmp_path / "store2"
    generate(store2, 1, options={"steps": 24, "size": 32})
    with pytest.raises(SchemaMismatchError, match=r"observation\.images\.cam: 48x48 .* 32x32"):
        export_store(store2, out)
    assert tree_digest(out) == before
    with open_store(store2) as view:
        assert [r.state for r in view.attempts()] == ["committed"]  # staging untouched


def test_unwritable_or_full_target_is_a_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 2)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ExportError, match="cannot create"):
        export_store(store, blocker / "dataset")
    export_store(store, out)
    before = tree_digest(out)
    generate(store, 3)
    import demoforge.storage.lerobot.version_builder as version_builder

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(version_builder, "write_tasks", full_disk)  # the version's end: its tasks file
    with pytest.raises(OSError, match="No space left"):
        export_store(store, out)
    monkeypatch.undo()
    assert tree_digest(out) == before and load(out).num_episodes == 2
    with open_store(store) as view:
        assert sorted(r.state for r in view.attempts()) == ["committed", "exported", "exported"]
    assert export_store(store, out).total_episodes == 3  # the next export completes it


def test_generate_with_export_flag(tmp_path):
    store, out = tmp_path / "store", tmp_path / "dataset"
    result = run_cli("generate", "--task", "toy-point", "--episodes", "2", "--store", str(store), "--codec", "h264",
                     "--export", str(out))
    assert result.returncode == 0, result.stderr
    assert "exported 2 episode(s)" in result.stdout
    check = run_cli("validate", str(out), "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["status"] == "valid"


def test_inspect_store_and_dataset_with_plot(tmp_path):
    store, out = tmp_path / "store", tmp_path / "dataset"
    generate(store, 4, options={**OPTIONS, "fail_every": 2}, max_attempts=3)
    export_store(store, out)
    for path in (store, out):
        result = run_cli("inspect", str(path), "--json", "--plot", str(tmp_path / f"{path.name}.png"))
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["episodes"] == 4 and data["frames"] == 96
        assert data["segments"]["approach"]["count"] == 4 and data["segments"]["approach"]["median"] == 12
        from PIL import Image
        picture = Image.open(tmp_path / f"{path.name}.png")
        assert picture.size[0] == 1200 and picture.size[1] > 200
    store_data = json.loads(run_cli("inspect", str(store), "--json").stdout)
    assert any(k.startswith("discarded:") for k in store_data["outcomes"])
    missing = run_cli("inspect", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "neither a demoforge store" in missing.stderr
