"""Staging formats 2 and 3 (Zarr v3 sharding; 3 adds the episode's statistics): an episode's file count does not
grow with its length, stores written in formats 1 and 2 keep working, and a store from a newer format is refused
by name."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pytest

import toy_tasks  # noqa: F401  (registers toy-point)
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.catalog import Catalog
from demoforge.storage.lerobot.validate import validate_dataset
from demoforge.storage.schema import CameraSpec
from demoforge.storage.staging import (SHARD_CHUNKS, STAGING_FORMAT, VIDEO_SHARD_BYTES, StagingCorruptError, StagingLayout,
                                      StagingStore)
from demoforge.storage.store_verify import verify_store
from helpers import REPO, run_cli

FORMAT1_STORE = REPO / "tests" / "data" / "store-format1.tar.gz"  # 3 toy episodes written by format-1 code


def spec(episodes: int, steps: int) -> JobSpec:
    return JobSpec(task="toy-point", episodes=episodes, task_options={"steps": steps, "size": 32},
                   video=VideoSettings(codec="h264"))


def episode_files(store: Path) -> dict[str, int]:
    base = store / "staging.zarr" / "episodes"
    return {p.name: sum(1 for f in p.rglob("*") if f.is_file()) for p in base.iterdir() if p.is_dir()}


def test_episode_file_count_does_not_grow_with_length(tmp_path: Path) -> None:
    short, long = tmp_path / "short", tmp_path / "long"
    run_job(spec(1, 20), short)
    run_job(spec(1, 400), long)
    # 5 arrays (state, action, reward, annotations, one camera), like ALOHA: 5 x (zarr.json + 1 shard) + group
    assert list(episode_files(short).values()) == [11]
    assert list(episode_files(long).values()) == [11]
    for store in (short, long):
        catalog = Catalog(store)
        try:
            fingerprint = catalog.fingerprint()
            assert fingerprint is not None, f"{store}: no job fingerprint"
            staging = StagingStore(store, StagingLayout.from_fingerprint(fingerprint))
            assert verify_store(catalog, staging).ok
        finally:
            catalog.close()


def test_long_episode_adds_one_file_per_array_per_shard_and_buffers_at_most_a_shard(tmp_path: Path) -> None:
    layout = StagingLayout(state_shapes={"observation.state": (14,)}, action_shape=(14,), cameras=(CameraSpec("top", 8, 8),))
    staging = StagingStore(tmp_path / "store", layout)
    writer = staging.open_episode("ep00000000-a00")
    rng = np.random.default_rng(0)
    frames, peak = 2500, 0
    for step in range(frames):
        row = rng.standard_normal(14).astype(np.float32)
        full = writer.add_frame({"observation.state": row}, row, 1.0, (1, step, 0, step, 0, frames, 0, 0))
        full |= writer.add_video("top", rng.bytes(3000))  # 7.5 MB of stream: seven whole 1 MiB shards and a tail
        peak = max(peak, writer.buffered_bytes())
        if full:
            writer.flush_full()
    sizes = writer.flush_all()
    shard_rows = layout.chunk_frames * SHARD_CHUNKS
    assert peak <= shard_rows * (14 + 14 + 1 + 8) * 4 + VIDEO_SHARD_BYTES + 3000
    # 2500 frames = 3 shards per numeric array, 7.5 MB = 8 video shards; + 5 zarr.json + the group's
    video_shards = -(-frames * 3000 // VIDEO_SHARD_BYTES)
    assert sum(1 for f in writer.path.rglob("*") if f.is_file()) == 4 * 3 + video_shards + 5 + 1
    staging.make_durable("ep00000000-a00")
    back = staging.read_episode("ep00000000-a00", frames, sizes)
    assert back.content_hash() == writer.content_hash() and len(back.video["top"]) == frames * 3000
    # The commit's fsync threads belong to this store and end with it (none left behind in the process).
    import threading

    assert any(t.name.startswith("fsync") for t in threading.enumerate())
    staging.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("fsync")]


def test_video_shards_of_another_size_are_read_by_their_metadata_and_a_missing_one_is_named(
        tmp_path: Path, monkeypatch) -> None:
    """Stores written before video shards were 1 MiB hold 4 MiB ones: a reader takes each array's shard size from
    its zarr.json, so such an episode reads back whole, and a lost shard of it is still an error."""
    import demoforge.storage.staging as staging_module

    layout = StagingLayout(state_shapes={"observation.state": (2,)}, action_shape=(2,),
                           cameras=(CameraSpec("top", 8, 8),))
    staging = StagingStore(tmp_path / "store", layout)
    monkeypatch.setattr(staging_module, "VIDEO_SHARD_BYTES", 4 * VIDEO_SHARD_BYTES)  # as the older code wrote
    writer = staging.open_episode("ep00000000-a00")
    monkeypatch.undo()
    rng = np.random.default_rng(0)
    frames = 2000
    for step in range(frames):
        row = rng.standard_normal(2).astype(np.float32)
        if writer.add_frame({"observation.state": row}, row, 1.0, (1, step, 0, step, 0, frames, 0, 0)) | \
                writer.add_video("top", rng.bytes(3000)):  # 6 MB: one whole 4 MiB shard and a tail
            writer.flush_full()
    sizes = writer.flush_all()
    staging.make_durable("ep00000000-a00")
    shards = writer.path / "video.top" / "c"
    assert sorted(p.name for p in shards.iterdir()) == ["0", "1"]  # the stream in 4 MiB files, not 1 MiB ones
    back = staging.read_episode("ep00000000-a00", frames, sizes)
    assert back.content_hash() == writer.content_hash()
    (shards / "1").unlink()
    with pytest.raises(StagingCorruptError, match="video.top/c/1"):
        staging.read_episode("ep00000000-a00", frames, sizes)
    staging.close()


def test_format1_store_is_read_exported_and_resumed(tmp_path: Path) -> None:
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    store.mkdir()
    with tarfile.open(FORMAT1_STORE) as tar:
        tar.extractall(store, filter="data")
    assert (store / "staging.zarr" / "episodes" / "ep00000000-a00" / "video" / "cam").is_dir()  # format 1
    verify = run_cli("verify", "--store", str(store))
    assert verify.returncode == 0 and "verified 3 committed episode(s)" in verify.stdout, verify.stderr
    export = run_cli("export", "--store", str(store), "--out", str(dataset))
    assert export.returncode == 0 and "exported 3 episode(s)" in export.stdout, export.stderr
    # Resuming writes the new episodes in format 2 next to the old ones.
    resumed = run_cli("generate", "--task", "toy-point", "--episodes", "5", "--store", str(store), "--codec", "h264",
                      "--option", "steps=8", "--option", "size=16", "--export", str(dataset))
    assert resumed.returncode == 0, resumed.stderr
    new = store / "staging.zarr" / "episodes" / "ep00000004-a00"
    assert json.loads((new / "zarr.json").read_text())["attributes"]["demoforge_staging_format"] == STAGING_FORMAT
    assert "exported 2 episode(s)" in resumed.stdout
    verify = run_cli("verify", "--store", str(store))
    assert verify.returncode == 0 and "verified 5 committed episode(s) in" in verify.stdout
    check = validate_dataset(dataset)  # in process: the validate command itself is tested in test_export.py
    assert check.status == 0 and check.episodes == 5, check.to_json()


def test_store_of_a_newer_format_is_refused_by_name(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run_job(spec(1, 8), store)
    db = sqlite3.connect(store / "catalog.sqlite")
    db.execute(f"UPDATE meta SET value = '{STAGING_FORMAT + 1}' WHERE key = 'staging_format'")
    db.commit()
    db.close()
    again = run_cli("generate", "--task", "toy-point", "--episodes", "2", "--store", str(store), "--codec", "h264",
                    "--option", "steps=8")
    assert again.returncode == 2
    assert f"written by a newer demoforge (staging format {STAGING_FORMAT + 1})" in again.stderr
    assert f"reads formats 1 to {STAGING_FORMAT}" in again.stderr
