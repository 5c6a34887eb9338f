"""Recording never runs anything at real-time priority: SVT-AV1 asks for SCHED_FIFO 99 as root (the opening
thread and every thread it creates), and a real-time encoder preempts the simulator and everything started
after it. The witness test shows the hazard is real on this machine; the others fail without the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import numpy as np
import psutil
import pytest

import toy_tasks
from demoforge.stages.camera_encoder import CameraEncoder
from demoforge.stages.encode import encode_stage
from demoforge.stages.encoder_process import EncoderProcess
from demoforge.stages.executor import RangeWorkSource, Executor
from demoforge.stages.record_encoder import RecordEncoder
from demoforge.stages.records import EncodedFrame, Frame
from demoforge.stages.settings import VideoSettings
from demoforge.storage.scheduling import normal_priority, realtime_threads, reset_process_priority, thread_schedules
from demoforge.storage.schema import CameraSpec
from helpers import cli_env, demoforge_argv
from test_stages import INFO, OPTIONS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="real-time priority needs root (CI runs as root)")

CAMERA = CameraSpec("front", 64, 64)

WITNESS = """
import io, os, av, numpy as np
c = av.open(io.BytesIO(), "w", format="mp4"); s = c.add_stream("libsvtav1", rate=30)
s.width = s.height = 64; s.pix_fmt = "yuv420p"
for p in s.encode(av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")): c.mux(p)
fifo = [t for t in os.listdir("/proc/self/task") if os.sched_getscheduler(int(t)) == os.SCHED_FIFO]
print(os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, len(fifo))
"""


def process_tree_realtime(pid: int) -> list[str]:
    """Every real-time thread of a process and its descendants, as 'pid/tid policy priority'."""
    found: list[str] = []
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for proc in procs:
        found += [f"{proc.pid}/{t.tid} {t.policy} {t.priority}" for t in realtime_threads(proc.pid)]
    return found


def child_policy() -> int:
    child = subprocess.Popen(["sleep", "60"])
    try:
        return os.sched_getscheduler(child.pid)
    finally:
        child.kill()
        child.wait()


def test_svt_av1_opened_by_pyav_alone_makes_threads_real_time_here() -> None:
    """The hazard, in a separate process: without normal_priority the opening thread and SVT-AV1's threads are
    SCHED_FIFO 99 (so the tests below can fail)."""
    proc = subprocess.run([sys.executable, "-c", WITNESS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SVT_LOG": "1"})
    assert proc.returncode == 0, proc.stderr
    policy, priority, fifo = map(int, proc.stdout.split())
    assert (policy, priority) == (os.SCHED_FIFO, 99) and fifo > 1


def test_an_av1_encoder_leaves_every_thread_and_later_children_at_normal_priority() -> None:
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    encoder = CameraEncoder(CAMERA, 30, VideoSettings())
    for i in range(8):
        encoder.encode(np.full((64, 64, 3), i * 20, np.uint8))
    open_realtime = realtime_threads()
    open_schedule = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    open_child = child_policy()
    assert encoder.finish()
    assert open_realtime == []
    assert open_schedule == before
    assert open_child == os.SCHED_OTHER


def av1_toy_records(episodes: int) -> tuple[list, tuple[CameraSpec, ...]]:
    """The executor's records of toy episodes with a camera SVT-AV1 accepts (at least 64x64), and its cameras."""
    options = {**OPTIONS, "size": 64}
    env = toy_tasks.CameraPointEnv(options)
    try:
        records = list(Executor(env, task="toy-point").run(RangeWorkSource(episodes)))
    finally:
        env.close()
    return records, toy_tasks.describe(options).cameras


def encoder_process_threads(idle: bool) -> tuple[dict[int, int], int, int]:
    """The scheduling class of every thread of an encoder process whose AV1 encoder is open and has encoded a
    frame (SVT-AV1's own threads exist then), once it has no job left, the process's id, and the class of this
    test's thread meanwhile."""
    records, cameras = av1_toy_records(1)
    encoder = RecordEncoder(cameras, INFO.fps, VideoSettings(), apart=True, lag=0, idle=idle)
    try:
        out: list = []
        for record in records:  # lag 0: each result is back before feed returns
            out += encoder.feed(record)
            if any(isinstance(r, EncodedFrame) for r in out):
                break
        assert any(isinstance(r, EncodedFrame) for r in out)
        assert isinstance(encoder.lanes, EncoderProcess)
        pid = encoder.lanes.pid

        def classes() -> dict[int, int]:
            return {tid: s.policy for tid, s in thread_schedules(pid).items()}

        # The worker waited for each result, so the child raised its encoders; it lowers them again once the
        # result has gone back: wait for that (a poll of the threads, not a sleep standing for it).
        deadline = time.monotonic() + 30
        while idle and list(classes().values()).count(os.SCHED_OTHER) > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return classes(), pid, os.sched_getscheduler(0)
    finally:
        encoder.close()


def test_the_idle_encoder_process_runs_its_encoders_at_idle_priority() -> None:
    """Idle priority (the default wherever the encoder process runs): the lanes and SVT-AV1's threads are
    SCHED_IDLE, so the simulator's renderer preempts them; the child's main thread (it reads the worker's messages)
    and its result sender stay normal, as does the env's own thread. At normal priority every thread is
    SCHED_OTHER."""
    idle, pid, ours = encoder_process_threads(idle=True)
    normal_ones = {tid for tid, policy in idle.items() if policy == os.SCHED_OTHER}
    assert len(idle) >= 4, idle  # main, lane, result sender and SVT-AV1's own threads
    assert pid in normal_ones and len(normal_ones) == 2, idle  # the main thread and the result sender
    assert set(idle.values()) == {os.SCHED_OTHER, os.SCHED_IDLE} and ours == os.SCHED_OTHER
    normal, _, _ = encoder_process_threads(idle=False)
    assert len(normal) >= 4 and set(normal.values()) == {os.SCHED_OTHER}


def encode_beside_a_busy_core(records: list, cameras: tuple[CameraSpec, ...], idle: bool) -> tuple[float, int]:
    """Feed the records to an encoder process that shares its one core with a busy program; the seconds it took
    (at most 120) and the frames encoded."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # the encoder process and the busy program inherit it
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    done = threading.Event()
    out: list = []
    errors: list[BaseException] = []
    try:
        encoder = RecordEncoder(cameras, INFO.fps, VideoSettings(), apart=True, idle=idle)
        os.sched_setaffinity(0, before)  # this test's threads feed from any core

        def feed() -> None:
            try:
                for record in records:
                    out.extend(encoder.feed(record))
                out.extend(encoder.drain())
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        start = time.monotonic()
        threading.Thread(target=feed, daemon=True).start()
        try:
            done.wait(timeout=120)
            seconds = time.monotonic() - start
        finally:
            encoder.close()
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    assert not errors, errors
    return seconds, sum(isinstance(r, EncodedFrame) for r in out)


def test_an_idle_encoder_process_is_not_starved_by_a_busy_core() -> None:
    """With its core kept busy by another program, the idle encoder keeps about the pace of a normal one: the
    worker's wait for a result raises the encoders to normal priority until they caught up (1.2-1.3 times the
    normal one's time here). Left in the idle class they took 44 times as long: 35 s against 0.8 s for 12 frames."""
    records, cameras = av1_toy_records(2)
    frames = sum(isinstance(r, Frame) for r in records)
    normal_s, normal_frames = encode_beside_a_busy_core(records, cameras, idle=False)
    idle_s, idle_frames = encode_beside_a_busy_core(records, cameras, idle=True)
    assert normal_frames == idle_frames == frames
    assert idle_s < 3 * normal_s, f"idle {idle_s:.1f} s, normal {normal_s:.1f} s for {frames} frames"


@pytest.mark.anyio
async def test_the_encode_stage_lanes_open_av1_at_normal_priority() -> None:
    """The lanes (one thread per camera) open the encoders: none of their threads, nor a child started while
    they are open, is real-time."""
    records, cameras = av1_toy_records(2)
    in_send, in_recv = anyio.create_memory_object_stream[object](len(records))
    for item in records:
        in_send.send_nowait(item)
    in_send.close()
    out_send, out_recv = anyio.create_memory_object_stream[object](1)  # each record waits for this test
    seen_realtime: list[object] = []
    children: list[int] = []
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: encode_stage(in_recv, out_send, cameras=cameras,  # type: ignore[arg-type]
                                               fps=INFO.fps, settings=VideoSettings()))
            async with out_recv:
                async for record in out_recv:
                    if isinstance(record, EncodedFrame):  # a lane's encoder is open now
                        seen_realtime.extend(realtime_threads())
                        children.append(child_policy())
    assert len(children) == sum(isinstance(r, Frame) for r in records)
    assert seen_realtime == []
    assert set(children) == {os.SCHED_OTHER}


def test_threads_made_real_time_by_other_means_inside_the_block_are_put_back() -> None:
    """A thread that became real-time without a capability (another library, an RTPRIO limit) is restored."""
    started = threading.Event()
    stop = threading.Event()
    tids: list[int] = []

    def worker() -> None:
        tids.append(threading.get_native_id())
        started.set()
        stop.wait()

    with normal_priority():
        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        # Another process makes the thread real-time (as an RTPRIO limit or another library could).
        subprocess.run(["chrt", "-f", "-p", "10", str(tids[0])], check=True)
        assert os.sched_getscheduler(tids[0]) == os.SCHED_FIFO
    try:
        assert os.sched_getscheduler(tids[0]) == os.SCHED_OTHER
    finally:
        stop.set()
        thread.join()


def test_reset_process_priority_returns_a_real_time_process_to_normal() -> None:
    code = ("import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10)); "
            "from demoforge.storage.scheduling import reset_process_priority; n = reset_process_priority(); "
            "print(n, os.sched_getscheduler(0))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", str(os.SCHED_OTHER)]
    assert reset_process_priority() == 0  # the test process itself was never real-time


def watch(proc: subprocess.Popen[str]) -> tuple[list[str], int]:
    """Sample the job's process tree until it exits: real-time threads seen, most threads seen at once."""
    realtime: list[str] = []
    most = 0
    while True:
        realtime += process_tree_realtime(proc.pid)
        try:
            most = max(most, sum(p.num_threads() for p in [psutil.Process(proc.pid),
                                                            *psutil.Process(proc.pid).children(recursive=True)]))
        except psutil.NoSuchProcess:
            pass
        try:
            proc.wait(timeout=0.02)  # the job's end, or the next sample (leaves the job its cores)
            return realtime, most
        except subprocess.TimeoutExpired:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["thread", "process", "thread --encoder-process on"])
def test_an_av1_job_runs_no_thread_of_any_process_at_real_time(tmp_path: Path, executor: str) -> None:
    argv = demoforge_argv("generate", "--task", "toy-point", "--episodes", "4", "--store", str(tmp_path / "s"),
                          "--option", "size=64", "--executor", *executor.split(), "--workers", "1")
    # Encoding slowed a little, so the job's encoders are open for a while the test samples.
    proc = subprocess.Popen(argv, env=cli_env(DEMOFORGE_STAGE_DELAY="encode:0.02"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    realtime, most = watch(proc)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "4/4 episodes committed" in out
    assert most > 20, "the sampling should have seen SVT-AV1's encoder threads alive"
    assert realtime == []


@pytest.mark.slow
def test_a_demoforge_process_started_at_real_time_runs_at_normal_priority(tmp_path: Path) -> None:
    """Whatever its parent's state: the viewer started under `chrt -f 10` serves at normal priority."""
    store = tmp_path / "s"
    made = subprocess.run(demoforge_argv("generate", "--task", "toy-point", "--episodes", "1", "--store",
                                         str(store), "--option", "size=64", "--codec", "h264"),
                          env=cli_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stderr
    proc = subprocess.Popen(["chrt", "-f", "10", *demoforge_argv("view", str(store), "--port", "0")],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server says where it serves once it is up
        assert "http://" in line, line
        assert process_tree_realtime(proc.pid) == []
    finally:
        proc.terminate()
        proc.wait(timeout=60)


REPAIR = """
import os, sys
from demoforge.storage.lerobot.repair import repair_dataset
from demoforge.storage.scheduling import realtime_threads
report = repair_dataset(sys.argv[1], sys.argv[2], encode_pngs=True, vcodec="libsvtav1")
print(sum(e.recovered for e in report.episodes), os.sched_getscheduler(0), len(realtime_threads()))
"""


@pytest.mark.slow
def test_repair_encodes_a_crashed_recordings_pngs_with_av1_at_normal_priority(tmp_path: Path) -> None:
    """`demoforge repair --encode-pngs` runs LeRobot's own encoder (SVT-AV1 by default): in a separate process,
    so that the hazard, if it came back, could not reach this test's worker."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    camera = "observation.images.front"
    features = {"observation.state": {"dtype": "float32", "shape": (2,), "names": None},
                "action": {"dtype": "float32", "shape": (2,), "names": None},
                camera: {"dtype": "video", "shape": (64, 64, 3), "names": ["height", "width", "channels"]}}
    # Batch encoding: the saved episode is only PNGs until its batch fills; the copy is what a kill leaves.
    dataset = LeRobotDataset.create("local/pngs", fps=10, features=features, root=tmp_path / "recording",
                                    use_videos=True, rgb_encoder=RGBEncoderConfig(vcodec="h264"),
                                    batch_encoding_size=2)
    for step in range(12):
        dataset.add_frame({"observation.state": np.full(2, step, np.float32), "action": np.zeros(2, np.float32),
                           camera: np.full((64, 64, 3), step * 20, np.uint8), "task": "hold still"})
    dataset.save_episode()
    import shutil

    shutil.copytree(tmp_path / "recording", tmp_path / "crashed")
    assert not list((tmp_path / "crashed").glob("videos/**/*.mp4"))  # nothing encoded yet: only PNGs
    proc = subprocess.run([sys.executable, "-c", REPAIR, str(tmp_path / "crashed"), str(tmp_path / "repaired")],
                          env=cli_env(HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recovered, policy, realtime = map(int, proc.stdout.split()[-3:])
    assert recovered == 1 and list((tmp_path / "repaired").glob("videos/**/*.mp4"))
    assert (policy, realtime) == (os.SCHED_OTHER, 0)
