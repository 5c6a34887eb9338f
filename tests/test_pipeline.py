"""The staged pipeline end to end, in process: real Zarr stores, real PyAV encoding, the real catalog."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

import toy_tasks  # noqa: F401  (registers toy-point)
from demoforge.pipeline.job import JobConfigError, JobSpec, VideoSettings
from demoforge.pipeline.runner import JobRunner, run_job
from demoforge.pipeline.tasks.registry import TaskEntry, get_task
from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.stages.executor import derive_seed, run_episodes
from demoforge.stages.records import AttemptEnded, Frame
from demoforge.storage.catalog import Catalog, JobMismatchError
from demoforge.storage.store import open_store
from demoforge.storage.staging import StagingLayout, StagingStore
from demoforge.storage.store import StoreError, StoreLockedError
from demoforge.storage.store_verify import verify_store
from helpers import decode_frames, psnr, read_row, run_cli

H264 = VideoSettings(codec="h264")


def toy(episodes: int, **kw) -> JobSpec:
    options = kw.pop("task_options", {})
    return JobSpec(task="toy-point", episodes=episodes, task_options=options, video=kw.pop("video", H264), **kw)


def open_staging(store, update: bool = False) -> tuple[Catalog, StagingStore]:
    """The store's catalog and staged episodes, read-only unless ``update`` (verify's quarantine writes)."""
    catalog = Catalog.open_existing(store) if update else Catalog.open_read_only(store)
    fingerprint = catalog.fingerprint()
    assert fingerprint is not None
    return catalog, StagingStore(Path(store), StagingLayout.from_fingerprint(fingerprint), read_only=True)


def expected_episode(spec: JobSpec, episode_index: int):
    """Run the executor directly (no pipeline) for the committed attempt of one episode."""
    env = get_task(spec.task).build(spec.task_options)
    try:
        records = list(run_episodes(env, task=spec.task, episodes=episode_index + 1, job_seed=spec.seed,
                                    max_attempts=spec.max_attempts))
    finally:
        env.close()
    ended = [r for r in records if isinstance(r, AttemptEnded) and r.key.episode_index == episode_index
             and r.result.committable][0]
    return [r for r in records if isinstance(r, Frame) and r.key == ended.key], ended


@pytest.mark.parametrize("codec", ["h264", "libsvtav1"])
def test_committed_episodes_hold_exactly_what_the_executor_produced(tmp_path, codec):
    spec = toy(3, video=VideoSettings(codec=codec), task_options={"steps": 70})
    report = run_job(spec, tmp_path / "store")
    assert report.committed_total == 3 and report.frames_this_run == 210
    catalog, staging = open_staging(tmp_path / "store")
    rows = catalog.committed()
    assert [r.episode_index for r in rows] == [0, 1, 2]
    for row in rows:
        frames, ended = expected_episode(spec, row.episode_index)
        assert row.seed == derive_seed(0, row.episode_index, row.attempt) == ended.result.seed
        staged = read_row(staging, row)
        assert row.frames == len(frames) == 70
        np.testing.assert_array_equal(staged.state["observation.state"],
                                      np.stack([f.state["observation.state"] for f in frames]))
        np.testing.assert_array_equal(staged.action, np.stack([f.action for f in frames]))
        np.testing.assert_array_equal(staged.reward, np.array([f.reward for f in frames], np.float32))
        np.testing.assert_array_equal(staged.annotations, np.array([f.annotations.as_tuple() for f in frames]))
        decoded = decode_frames(staged.video["cam"])
        assert len(decoded) == 70
        worst = min(psnr(d, f.images["cam"]) for d, f in zip(decoded, frames))
        assert worst > 28, f"{codec}: worst frame PSNR {worst:.1f} dB"
        record = row.record
        assert record is not None and record["schema_version"] == 1 and [s["name"] for s in record["segments"]] == ["approach", "retreat"]
    assert verify_store(catalog, staging).ok
    catalog.close()


def test_resume_continues_to_exactly_the_target_with_the_same_seeds(tmp_path):
    store = tmp_path / "store"
    assert run_job(toy(3), store).committed_this_run == 3
    report = run_job(toy(7), store)
    assert report.committed_this_run == 4 and report.committed_total == 7
    assert run_job(toy(7), store).committed_this_run == 0  # already complete: nothing more
    catalog, _ = open_staging(store)
    rows = catalog.committed()
    assert [r.episode_index for r in rows] == list(range(7))
    assert [r.seed for r in rows] == [derive_seed(0, i, 0) for i in range(7)]
    catalog.close()


def test_failed_attempts_are_discarded_retried_and_leave_no_data(tmp_path):
    # fail_every=2: attempts whose seed is even fail their success check, deterministically.
    spec = toy(6, task_options={"fail_every": 2}, max_attempts=2)
    report = run_job(spec, tmp_path / "store")
    catalog, staging = open_staging(tmp_path / "store")
    committed = catalog.committed()
    discarded = catalog.attempts(("discarded",))
    assert report.committed_total == 6 and len(committed) == 6
    assert discarded and all(r.terminal_reason == "task_incomplete" for r in discarded)
    expected_abandoned = {i for i in range(20) if all(derive_seed(0, i, a) % 2 == 0 for a in range(2))}
    assert {r.episode_index for r in committed}.isdisjoint(expected_abandoned)
    # Only committed episodes have staged data; discarded attempts' folders are gone.
    assert set(staging.episode_ids()) == {r.episode_id for r in committed}
    # A committed episode that followed a discarded attempt on the same episode index holds only its own frames.
    for row in committed:
        assert len(decode_frames(read_row(staging, row).video["cam"])) \
            == row.frames == 20
    catalog.close()


def test_a_different_job_on_an_existing_store_is_refused(tmp_path):
    store = tmp_path / "store"
    run_job(toy(1), store)
    with pytest.raises(JobMismatchError, match=r"video: store has .*'h264'.*libsvtav1"):
        run_job(toy(1, video=VideoSettings()), store)
    with pytest.raises(JobMismatchError, match="cameras"):
        run_job(toy(1, task_options={"size": 48}), store)
    with pytest.raises(JobMismatchError, match="seed"):
        run_job(toy(1, seed=5), store)
    result = run_cli("generate", "--task", "toy-point", "--episodes", "1", "--store", str(store), "--codec", "h264",
                     "--option", "size=16")
    assert result.returncode == 2 and "created for a different job" in result.stderr and "cameras" in result.stderr


def test_bad_job_settings_are_refused():
    with pytest.raises(JobConfigError, match="workers"):
        toy(1, workers=0)
    with pytest.raises(JobConfigError, match="codec"):
        VideoSettings(codec="mpeg1")


def test_unwritable_store_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        # root ignores permission bits; a path under a regular file can never be created.
        blocker = tmp_path / "file"
        blocker.write_text("x")
        target = blocker / "store"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        target = ro / "store"
    with pytest.raises(StoreError, match="cannot create store directory"):
        run_job(toy(1), target)


def test_one_writer_per_store(tmp_path):
    store = tmp_path / "store"
    spec = toy(1)
    first = open_store(store, "w", fingerprint=spec.fingerprint())
    try:
        with pytest.raises(StoreLockedError, match="another demoforge process"):
            open_store(store, "w", fingerprint=spec.fingerprint())
    finally:
        first.close()


def test_corrupted_chunk_is_detected_and_quarantined_then_replaced(tmp_path):
    store = tmp_path / "store"
    run_job(toy(3), store)
    catalog, staging = open_staging(store, update=True)
    victim = catalog.committed()[1]
    chunk = staging.episode_path(victim.episode_id) / "action" / "c" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x40
    chunk.write_bytes(bytes(data))
    report = verify_store(catalog, staging, quarantine=True)
    assert [p.episode_id for p in report.problems] == [victim.episode_id]
    assert "checksum" in report.problems[0].problem
    assert [r.episode_id for r in catalog.attempts(("quarantined",))] == [victim.episode_id]
    catalog.close()
    # The job is short one good episode now: a re-run replaces it with a new episode index.
    rerun = run_job(toy(3), store)
    assert rerun.committed_this_run == 1 and rerun.committed_total == 3
    catalog, _ = open_staging(store)
    assert [r.episode_index for r in catalog.committed()] == [0, 2, 3]
    catalog.close()


def test_truncated_chunk_is_detected(tmp_path):
    store = tmp_path / "store"
    run_job(toy(2), store)
    catalog, staging = open_staging(store)
    row = catalog.committed()[0]
    video_chunk = staging.episode_path(row.episode_id) / "video.cam" / "c" / "0"  # one shard
    video_chunk.write_bytes(video_chunk.read_bytes()[:-7])
    report = verify_store(catalog, staging)
    assert [p.episode_id for p in report.problems] == [row.episode_id]
    catalog.close()
    result = run_cli("verify", "--store", str(store))
    assert result.returncode == 1 and row.episode_id in result.stdout


def test_camera_changing_shape_mid_episode_discards_that_attempt(tmp_path, register_task):
    class Growing(toy_tasks.CameraPointEnv):
        def demo_record(self, observation):
            rec = super().demo_record(observation)
            if self._seed == derive_seed(0, 1, 0) and self.t == 5:
                return type(rec)(state=rec.state, images={"cam": np.zeros((33, 32, 3), np.uint8)})
            return rec

    register_task(TaskEntry(name="toy-growing", defaults=toy_tasks.DEFAULTS, describe=toy_tasks.describe,
                            make_env=lambda o: Growing(dict(o))))
    spec = JobSpec(task="toy-growing", episodes=3, video=H264)
    report = run_job(spec, tmp_path / "store")
    assert report.committed_total == 3 and report.discarded == {"error": 1}
    catalog, staging = open_staging(tmp_path / "store")
    (bad,) = catalog.attempts(("discarded",))
    assert bad.episode_id == "ep00000001-a00" and bad.reason is not None and "camera 'cam' changed" in bad.reason
    assert verify_store(catalog, staging).ok
    catalog.close()


def test_encoder_failure_surfaces_and_keeps_committed_data(tmp_path, monkeypatch):
    store = tmp_path / "store"
    run_job(toy(2), store)
    from demoforge.stages import camera_encoder

    calls = {"n": 0}
    real = camera_encoder.CameraEncoder.encode

    def failing(self, image):
        calls["n"] += 1
        if calls["n"] == 30:
            raise camera_encoder.EncoderError("camera 'cam' frame 9: simulated encoder failure")
        return real(self, image)

    monkeypatch.setattr(camera_encoder.CameraEncoder, "encode", failing)
    # The job's task group re-raises the stage's own error, typed (the CLI turns it into a few lines). The
    # encoders run beside the env here, where the patch reaches them (tests/test_encoder_process.py fails one
    # in its own process).
    with pytest.RaisesGroup(pytest.RaisesExc(camera_encoder.EncoderError, match="simulated encoder failure")):
        run_job(dataclasses.replace(toy(5), encoder_process=False), store)
    monkeypatch.undo()
    catalog, staging = open_staging(store)
    assert [r.episode_index for r in catalog.committed()][:2] == [0, 1]
    assert verify_store(catalog, staging).ok
    catalog.close()
    # A resumed run recovers the dead attempt and finishes.
    report = run_job(toy(5), store)
    assert report.committed_total == 5 and report.recovery.cleaned >= 1


def test_full_disk_while_staging_surfaces_and_keeps_committed_data(tmp_path, monkeypatch):
    store = tmp_path / "store"
    run_job(toy(2), store)
    from demoforge.storage import staging as staging_mod

    def enospc(self, start, data):  # every chunk write of a numeric array finds the disk full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(staging_mod._ChunkBuffer, "write", enospc)
    with pytest.RaisesGroup(pytest.RaisesExc(OSError, check=lambda e: e.errno == errno.ENOSPC)):
        run_job(toy(4), store)
    monkeypatch.undo()
    catalog, staging = open_staging(store)
    assert [r.episode_index for r in catalog.committed()] == [0, 1]
    assert verify_store(catalog, staging).ok
    catalog.close()


def test_stop_discards_in_flight_and_keeps_committed(tmp_path):
    spec = toy(50, task_options={"step_sleep": 0.01})
    runner = JobRunner(spec, tmp_path / "store")
    seen = threading.Event()

    def on_progress(stats):
        if stats.committed >= 2:
            seen.set()
            runner.stop()

    runner.on_progress = on_progress
    import anyio

    report = anyio.run(runner.run)
    assert seen.is_set() and report.interrupted and 2 <= report.committed_total < 50
    catalog, staging = open_staging(tmp_path / "store")
    assert not catalog.attempts(("staging",))
    assert set(staging.episode_ids()) == {r.episode_id for r in catalog.committed()}
    interrupted = catalog.attempts(("discarded",))
    assert all(r.terminal_reason == "interrupted" and not r.counted for r in interrupted)
    catalog.close()


def test_vector_env_and_several_workers_produce_the_same_episodes(tmp_path):
    serial = tmp_path / "serial"
    parallel = tmp_path / "parallel"
    run_job(toy(6, task_options={"fail_every": 3}), serial)
    run_job(toy(6, task_options={"fail_every": 3}, workers=2, num_envs=2), parallel)
    a, _ = open_staging(serial)
    b, _ = open_staging(parallel)
    key = lambda rows: [(r.episode_index, r.attempt, r.seed, r.frames, r.content_hash) for r in rows]
    assert key(a.committed()) == key(b.committed())
    a.close()
    b.close()


def test_status_reports_counts_json(tmp_path):
    store = tmp_path / "store"
    run_job(toy(3, task_options={"fail_every": 2}), store)
    result = run_cli("status", "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["attempts_by_state"]["committed"] == 3
    assert data["committed_frames"] == 60
    assert data["fingerprint"]["task"] == "toy-point"
    assert sum(data["discarded_by_reason"].values()) == data["attempts_by_state"].get("discarded", 0)
    human = run_cli("status", "--store", str(store))
    assert "committed=3" in human.stdout
    missing = run_cli("status", "--store", str(store / "nope"))
    assert missing.returncode == 2 and "not a demoforge store" in missing.stderr


def test_annotations_are_stored_in_contract_order(tmp_path):
    run_job(toy(1), tmp_path / "store")
    catalog, staging = open_staging(tmp_path / "store")
    row = catalog.committed()[0]
    ann = read_row(staging, row).annotations
    cols = {k: ann[:, i] for i, k in enumerate(ANNOTATION_KEYS)}
    assert cols["segment_start"].sum() == 2 and cols["segment_end"].sum() == 2 and cols["terminated"][-1] == 1
    catalog.close()


def test_all_zero_chunks_are_written_and_verify(tmp_path, register_task):
    """Zero rewards and zero actions fill whole chunks with the fill value; they must still be on disk."""
    class Still(toy_tasks.CameraPointEnv):
        def create_demo_segments(self):
            from demoforge.stages.contract import Segment
            yield Segment(actions=[np.zeros(1, np.float32)] * 70, name="wait")

        def step(self, action):
            obs, _reward, terminated, truncated, info = super().step(action)
            return obs, 0.0, terminated, truncated, info

    register_task(TaskEntry(name="toy-still", defaults=toy_tasks.DEFAULTS, describe=toy_tasks.describe,
                            make_env=lambda o: Still(dict(o))))
    run_job(JobSpec(task="toy-still", episodes=1, video=H264), tmp_path / "store")
    catalog, staging = open_staging(tmp_path / "store")
    assert verify_store(catalog, staging).ok
    row = catalog.committed()[0]
    assert not read_row(staging, row).reward.any()
    catalog.close()
