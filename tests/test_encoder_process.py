"""A worker's encoders in a process of their own (stages/encoder_process.py): the same bytes and statistics as
lanes beside the env, the same errors, and no process left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import psutil
import pytest

from demoforge.stages.camera_encoder import EncoderError
from demoforge.stages.encoder_process import EncoderProcess
from demoforge.stages.record_encoder import RecordEncoder
from demoforge.stages.records import AttemptEnded, EncodedFrame, Frame, VideoTail
from demoforge.stages.settings import VideoSettings
from demoforge.storage.write_errors import StorageWriteError
from helpers import decode_frames, packages_imported_by
from test_stages import INFO, toy_records

H264 = VideoSettings(codec="h264")


def encode_all(records: list, apart: bool, **kwargs) -> list:
    encoder = RecordEncoder(INFO.cameras, INFO.fps, H264, apart=apart, **kwargs)
    try:
        out = []
        for record in records:
            out += encoder.feed(record)
        return out + encoder.drain()
    finally:
        encoder.close()
        if apart:  # closing ends the encoder process
            assert isinstance(encoder.lanes, EncoderProcess) and encoder.lanes._process.poll() is not None


def test_encoders_in_their_own_process_give_the_same_bytes_and_statistics_as_beside_the_env():
    records = toy_records(2, fail_every=2, max_attempts=2)  # a failed attempt (dropped video) between kept ones
    beside, apart = encode_all(records, apart=False), encode_all(records, apart=True)
    assert [type(r) for r in apart] == [type(r) for r in beside]
    frames = [(a, b) for a, b in zip(apart, beside) if isinstance(a, EncodedFrame)]
    assert frames and all(a.video == b.video and a.step == b.step for a, b in frames)
    tails = [(a, b) for a, b in zip(apart, beside) if isinstance(a, VideoTail)]
    ends = [r for r in apart if isinstance(r, AttemptEnded)]
    assert any(not r.result.keeps_data for r in ends)  # a dropped attempt came between
    assert len(tails) == sum(r.result.keeps_data for r in ends) >= 1  # kept attempts only
    for a, b in tails:
        assert a.video == b.video
        for camera in a.stats:
            for stat in b.stats[camera]:
                np.testing.assert_array_equal(a.stats[camera][stat], b.stats[camera][stat])
    # The video decodes to every frame of each kept attempt.
    for tail in (a for a, _ in tails):
        data = b"".join(r.video[name] for r in apart if isinstance(r, EncodedFrame) and r.key == tail.key
                        for name in [INFO.cameras[0].name]) + tail.video[INFO.cameras[0].name]
        ended = next(r for r in apart if isinstance(r, AttemptEnded) and r.key == tail.key)
        assert len(decode_frames(data)) == ended.frames


def test_a_frame_of_the_wrong_shape_is_refused_before_it_reaches_the_child():
    (started, frame) = [r for r in toy_records(1)][:2]
    assert isinstance(frame, Frame)
    name = INFO.cameras[0].name
    bad = Frame(frame.key, frame.step, frame.state, frame.action, frame.reward, frame.annotations,
                {**frame.images, name: frame.images[name][:-1]})
    encoder = RecordEncoder(INFO.cameras, INFO.fps, H264, apart=True)
    try:
        encoder.feed(started)
        with pytest.raises(EncoderError, match=f"camera '{name}': frame of shape"):
            encoder.feed(bad)
    finally:
        encoder.close()


def test_an_encoder_failing_in_the_child_raises_what_it_raises_beside_the_env(tmp_path: Path):
    """The lane's own error crosses the process boundary, type and message (a full disk stays a
    StorageWriteError, which the CLI turns into exit status 4): here the statistics' folder is missing."""

    def failure(apart: bool) -> OSError:
        encoder = RecordEncoder(INFO.cameras, INFO.fps, H264, apart=apart, stats_dir=tmp_path / "missing", lag=0)
        try:
            with pytest.raises(OSError) as raised:
                for record in toy_records(1):
                    encoder.feed(record)
            return raised.value
        finally:
            encoder.close()

    beside, apart = failure(False), failure(True)
    assert type(apart) is type(beside) and apart.errno == beside.errno
    assert str(tmp_path / "missing") in str(apart) and str(tmp_path / "missing") in str(beside)


def test_a_write_failure_crosses_as_a_storage_write_error_naming_what_and_where():
    import errno
    import pickle

    error = StorageWriteError("the frames kept for camera 'cam''s statistics", "/some/store",
                              OSError(errno.ENOSPC, "No space left on device"))
    crossed = pickle.loads(pickle.dumps(error))  # what the child's socket does to it
    assert type(crossed) is StorageWriteError and crossed.errno == errno.ENOSPC and str(crossed) == str(error)


def test_a_killed_encoder_process_fails_the_attempt_and_the_next_lanes_work():
    records = toy_records(1)
    encoder = RecordEncoder(INFO.cameras, INFO.fps, H264, apart=True, lag=0)
    try:
        encoder.feed(records[0])
        encoder.feed(records[1])
        assert isinstance(encoder.lanes, EncoderProcess)
        pid = encoder.lanes.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EncoderError, match=rf"encoder process \(pid {pid}\) ended unexpectedly"):
            for record in records[2:]:
                encoder.feed(record)
        encoder.reset()  # what a worker does after an exception inside an attempt
        out = [o for record in records for o in encoder.feed(record)] + encoder.drain()
        assert sum(isinstance(r, EncodedFrame) for r in out) == sum(isinstance(r, Frame) for r in records)
    finally:
        encoder.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_job_with_its_encoders_apart_commits_the_same_bytes_on_every_executor(tmp_path: Path):
    from demoforge.pipeline.job import JobSpec
    from demoforge.pipeline.runner import run_job
    from demoforge.pipeline.workers.config import ExecutorConfig
    from helpers import committed_files

    def job(name: str, apart: bool, executor: ExecutorConfig | None = None) -> dict:
        spec = JobSpec(task="toy-point", episodes=3, video=H264, task_options={"size": 32, "steps": 8},
                       encoder_process=apart)
        report = run_job(spec, tmp_path / name, executor=executor)
        assert report.committed_total == 3
        return committed_files(tmp_path / name)

    beside = job("beside", False)
    assert job("apart", True) == beside
    assert job("apart-process", True, ExecutorConfig(kind="process", workers=1)) == beside


def test_a_killed_generate_leaves_no_encoder_process_behind(tmp_path: Path):
    import subprocess

    from helpers import cli_env, demoforge_argv

    argv = demoforge_argv("generate", "--task", "toy-point", "--episodes", "50", "--store", str(tmp_path / "s"),
                          "--option", "size=32", "--codec", "h264", "--encoder-process", "on")
    proc = subprocess.Popen(argv, env=cli_env(DEMOFORGE_STAGE_DELAY="encode:0.02"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        job = psutil.Process(proc.pid)
        children: list[psutil.Process] = []
        for _ in range(2400):  # until the job's encoder process is up (at most 120 s)
            children = [c for c in job.children(recursive=True) if "encoder_child" in " ".join(c.cmdline())]
            if children or proc.poll() is not None:
                break
            psutil.wait_procs([job], timeout=0.05)
        assert children, f"the job should have started an encoder process: {proc.communicate()[1][-2000:]!r}"
    finally:
        proc.kill()
        proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(children, timeout=60)
    assert alive == [], f"encoder processes outlived their killed job: {alive}"


def test_auto_runs_the_encoders_apart_for_frames_of_128x128_pixels_and_more():
    from demoforge.stages.settings import encoders_apart
    from demoforge.storage.schema import CameraSpec

    small, large = (CameraSpec("a", 96, 96), CameraSpec("b", 64, 64)), (CameraSpec("a", 224, 224),)
    assert not encoders_apart(None, small) and encoders_apart(None, large)
    assert encoders_apart(None, small + (CameraSpec("c", 128, 64),))  # 9216 + 4096 + 8192 pixels: 21504
    assert encoders_apart(True, small) and not encoders_apart(False, large)
    assert not encoders_apart(True, ())  # nothing to encode: no process
    # idle priority needs a process of their own: auto turns it on; an explicit off is refused by the job
    assert encoders_apart(None, small, idle=True) and not encoders_apart(None, (), idle=True)


def test_encoders_run_at_idle_priority_wherever_they_run_apart_unless_told_normal():
    """--encoder-priority auto (the default) is idle exactly where the encoder process runs; idle turns the
    process on; normal never lowers it; a job without cameras starts no process and lowers nothing."""
    from demoforge.stages.settings import encoder_placement
    from demoforge.storage.schema import CameraSpec

    small, large = (CameraSpec("a", 64, 64),), (CameraSpec("a", 224, 224),)
    assert encoder_placement(None, None, large) == (True, True)
    assert encoder_placement(None, None, small) == (False, False)  # beside the env: the env's own process
    assert encoder_placement(True, None, small) == (True, True)
    assert encoder_placement(None, True, small) == (True, True)
    assert encoder_placement(None, False, large) == (True, False)
    assert encoder_placement(False, None, large) == (False, False)
    assert encoder_placement(None, True, ()) == (False, False)


def test_the_encoder_process_imports_no_event_loop_no_gymnasium_and_no_store():
    # Every worker of every job starts one: what it imports is start-up time (and CPU) taken from the env.
    assert packages_imported_by("demoforge.stages.encoder_child",
                                {"anyio", "asyncio", "gymnasium", "zarr", "torch", "lerobot"}) == []
