#!/usr/bin/env python
"""Scale-out benchmark: what the process and Ray executors buy on this machine, and how many
workers one driver can serve.

Run from the repository root::

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_scale.py [--episodes 3] [--repeat 3] [--quick]

(a) aloha-transfer-cube 224x224, one worker: wall time of ``demoforge generate`` (thread, and process
    executor) over ``demoforge run`` (env only, nothing stored) on the same episodes.  Target (process) <= 1.05.
(b) 2 process workers vs 1 thread worker on the same episodes (one more than (a), so two workers share them
    evenly), with CPU utilisation (CPU seconds of the command and its worker processes / (wall x cores)).
    Target >= 1.4x.
(c) Driver ingest ceiling: synthetic workers hand the driver pre-encoded pieces as fast as it takes them
    (realistic sizes: ALOHA 1 camera 224x224 AV1 at 50 fps, 400-frame episodes, packets of the size measured
    in (a); 2 cameras 480x640, packets scaled by the pixel count), and only write + commit run. Committed frames/s and episodes/s, and from them the number of workers one driver
    serves at the per-worker rate measured in (b). Target >= 64 ALOHA workers.
(d) Ray overhead: the Ray executor with 1 actor (on a local Ray started in each round and settled before timing:
    its own start-up is not charged to the job) vs the process executor with 1 worker, on the episodes of (a).
    Target <= 1.10.

Every ratio compares numbers of the same invocation. Wall times include each command's start-up (imports,
env build, worker start), as a user sees them. The machine is shared: numbers swing between runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from round_ratio import round_ratio

if TYPE_CHECKING:
    import gymnasium as gym

    from demoforge.pipeline.workers.driver import WorkerHandle
    from demoforge.pipeline.workers.episode_worker import WorkerSpec
    from demoforge.stages.records import EpisodeAssignment

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ALOHA = ("--task", "aloha-transfer-cube")
REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def cli(*args: str) -> dict[str, Any]:
    """Run ``demoforge ARGS``; wall seconds and CPU seconds of it and every process it waited for."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "demoforge.pipeline.cli", *args], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"demoforge {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    frames = re.search(r"(\d+) frames,", done.stdout)
    count = int(frames.group(1)) if frames else None
    if count is None and args and args[0] == "run":  # `run` prints a table: count frames from its summary rows
        count = sum(int(m.group(1)) for m in re.finditer(r"│\s*success\s*│\s*(\d+)\s*│", done.stdout))
    return {"wall": wall, "cpu": cpu, "util": cpu / (wall * (os.cpu_count() or 1)), "frames": count,
            "frames_per_cpu_s": (count or 0) / cpu if cpu else 0.0, "stdout": done.stdout, "load": load()}


def run_env_only(episodes: int) -> dict[str, Any]:
    return cli("run", *ALOHA, "--episodes", str(episodes), "--max-attempts", "1")


def generate(store: Path, episodes: int, *extra: str) -> dict[str, Any]:
    shutil.rmtree(store, ignore_errors=True)
    return cli("generate", *ALOHA, "--episodes", str(episodes), "--max-attempts", "1", "--store", str(store), *extra)


def settle_ray(busy_below: float = 0.10, limit_s: float = 60.0) -> float:
    """Wait until the local Ray just started has finished starting: its processes (this process's descendants:
    the GCS, the raylet and the idle workers it prestarts) use less than ``busy_below`` of a core over a second,
    so what they still do after ``ray.init`` returns is not timed with the job (a user's cluster is up before
    the job). Here that took 1 s. Returns the seconds waited (at most ``limit_s``)."""
    import psutil

    def cpu() -> float:
        total = 0.0
        for child in psutil.Process().children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    started = time.monotonic()
    before = cpu()
    while time.monotonic() - started < limit_s:
        time.sleep(1.0)  # the measurement window itself
        now = cpu()
        if now - before < busy_below:
            break
        before = now
    return time.monotonic() - started


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time (the lower middle one for an even count), with every round's wall."""
    chosen = dict(sorted(runs, key=lambda r: r["wall"])[(len(runs) - 1) // 2])
    chosen["walls"] = [r["wall"] for r in runs]
    return chosen


def video_bytes_per_frame(store: Path) -> float:
    from demoforge.storage.store import open_store

    with open_store(store) as opened:
        rows = opened.committed()
    return sum(sum(r.video_bytes.values()) for r in rows) / max(1, sum(r.frames or 0 for r in rows))


# ----------------------------------------------------------------------------------------- (c) ingest
def no_env(options: Any) -> gym.Env:
    """The ingest task's env: never built, since its workers replay pieces without stepping anything."""
    raise RuntimeError("the ingest benchmark's task has no env: its synthetic workers step nothing")


def ingest(store: Path, cameras: int, height: int, width: int, fps: int, frames_per_episode: int, episodes: int,
           workers: int, packet_bytes: int) -> dict[str, Any]:
    """Write + commit alone, fed by synthetic workers that replay pre-encoded pieces instantly."""
    import anyio
    import numpy as np

    from demoforge.stages.contract import Annotations, EpisodeResult, TerminalReason
    from demoforge.pipeline.job import JobSpec, VideoSettings
    from demoforge.stages.records import AttemptEnded, AttemptKey, AttemptStarted, EncodedFrame, VideoTail
    from demoforge.pipeline.runner import JobRunner
    from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, TaskInfo, register
    from demoforge.pipeline.workers import driver
    from demoforge.pipeline.workers.config import ExecutorConfig
    from demoforge.pipeline.workers.episode_worker import Piece

    name = f"bench-ingest-{cameras}x{height}x{width}"
    specs = tuple(CameraSpec(f"cam{i}", height, width) for i in range(cameras))
    info = TaskInfo(name=name, description="synthetic", instruction="", fps=fps, action_shape=(14,),
                    state_shapes={"observation.state": (14,)}, cameras=specs, segment_names=("all",))
    try:
        register(TaskEntry(name=name, defaults={}, describe=lambda o: info, make_env=no_env))
    except ValueError:
        pass
    # The writer appends encoded bytes without looking into them: packets of the measured size stand in for
    # real ones (random bytes, so compression in zarr cannot shrink them).
    video = VideoSettings()
    rng = np.random.default_rng(0)
    packets = [{c.name: rng.bytes(packet_bytes) for c in specs} for _ in range(frames_per_episode)]
    tails = {c.name: rng.bytes(packet_bytes) for c in specs}
    # A camera's statistics come with its tail, as a real encoder's do (these are of blank frames).
    from demoforge.storage.lerobot_stats import rgb_stats, strided

    blank = strided(np.zeros((height, width, 3), np.uint8))
    tail_stats = {c.name: rgb_stats([blank, blank]) for c in specs}
    video_bytes = packet_bytes * cameras * (frames_per_episode + 1)
    state = {"observation.state": np.zeros(14, np.float32)}
    action = np.zeros(14, np.float32)

    def pieces_of(key: AttemptKey, batch: int = 16) -> Iterator[Piece]:
        records: list[Any] = [AttemptStarted(key, 0, 0, 0)]
        for i in range(frames_per_episode):
            ann = Annotations(episode_step=i, segment_id=0, segment_step=i, segment_start=i == 0,
                              segment_end=i == frames_per_episode - 1, terminated=i == frames_per_episode - 1,
                              truncated=False)
            records.append(EncodedFrame(key, i, state, action, 0.0, ann, packets[i]))
            if len(records) >= batch:
                yield Piece(tuple(records), len(records))
                records = []
        result = EpisodeResult(task=name, episode_index=key.episode_index, attempt=key.attempt, seed=0, row=0,
                               length=frames_per_episode, completed=True, success=True, terminated=True,
                               truncated=False, terminal_reason=TerminalReason.SUCCESS, segments=())
        records += [VideoTail(key, tails, tail_stats), AttemptEnded(key, result, frames_per_episode)]
        yield Piece(tuple(records), 0, lease_done=True)

    class SyntheticWorker:
        def __init__(self, slot: int) -> None:
            self.slot = slot
            self.pid: int | None = None
            self.host = "synthetic"
            self.name = f"synthetic worker {slot}"

        async def ready(self) -> None:
            pass

        async def unplaced(self) -> str | None:
            return None

        async def pieces(self, lease: EpisodeAssignment) -> AsyncIterator[Piece]:
            for piece in pieces_of(AttemptKey(lease.episode_index, lease.first_attempt)):
                yield piece

        def kill(self) -> None:
            pass

        async def aclose(self) -> None:
            pass

    class SyntheticBackend:
        kind = "synthetic"

        async def connect(self) -> str:
            return "synthetic"

        async def start_worker(self, slot: int, spec: WorkerSpec) -> WorkerHandle:
            return SyntheticWorker(slot)

        async def lacks_room(self) -> str | None:
            return None

        async def aclose(self) -> None:
            pass

    real = driver.make_backend
    driver.make_backend = lambda config: SyntheticBackend()
    try:
        shutil.rmtree(store, ignore_errors=True)
        spec = JobSpec(task=name, episodes=episodes, video=video)
        runner = JobRunner(spec, store, executor=ExecutorConfig(kind="process", workers=workers))
        started, cpu0 = time.monotonic(), time.process_time()
        report = anyio.run(runner.run)
        wall, cpu = time.monotonic() - started, time.process_time() - cpu0
        busy = runner.stats.busy.snapshot()
    finally:
        driver.make_backend = real
    frames = report.frames_this_run
    return {"frames_per_s": frames / wall, "episodes_per_s": report.committed_this_run / wall, "wall": wall,
            "cpu": cpu, "frames_per_cpu_s": frames / cpu,
            "frames": frames, "mb_per_s": video_bytes * episodes / wall / 2**20,
            "video_kb_per_frame": video_bytes / frames_per_episode / cameras / 1024, "busy": busy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=3, help="episodes of (a) and (d); (b) uses one more "
                                                                "(default 3)")
    parser.add_argument("--quick", action="store_true", help="1 episode, smaller ingest run (a smoke test)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of (a), (b) and (d), interleaved; the tables show each command's median "
                             "(default 1)")
    parser.add_argument("--ingest-only", action="store_true",
                        help="only (c), with the env-only run of (a) for the per-worker rate")
    args = parser.parse_args()
    n = 1 if args.quick else args.episodes
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        # (a), (b), (d) in interleaved rounds: each round runs every command once, so a change in the machine's
        # load hits all of them alike; the tables report each command's median over the rounds.
        rounds: dict[str, list[dict[str, Any]]] = {}

        def timed(key: str, label: str, run: Any) -> None:
            result = run()
            rounds.setdefault(key, []).append(result)
            log(f"  {label}: {result['wall']:.1f} s")

        m = n + 1
        for r in range(args.repeat):
            log(f"round {r + 1}/{args.repeat}: (a) aloha-transfer-cube, {n} episode(s), one worker; load {load()}")
            timed("env_only", "env only", lambda: run_env_only(n))
            if not args.ingest_only:
                timed("thread1", "generate, thread", lambda: generate(tmp / "thread1", n))
            timed("process1", "generate, process", lambda: generate(tmp / "process1", n, "--executor", "process"))
            if args.ingest_only:
                continue
            log(f"  (b) {m} episodes: 1 thread worker vs 2 process workers; load {load()}")
            timed("thread_b", "1 thread worker", lambda: generate(tmp / "thread_b", m))
            timed("process_b", "2 process workers",
                  lambda: generate(tmp / "process_b", m, "--executor", "process", "--workers", "2"))
            log(f"  (d) Ray, 1 actor, {n} episode(s) on a local Ray started and settled before timing; load {load()}")
            import ray

            ray_tmp = tempfile.mkdtemp(prefix="dfray")
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
            context = ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=256 << 20,
                               _temp_dir=ray_tmp, logging_level=logging.ERROR, log_to_driver=False)
            try:
                log(f"  Ray up; settled after {settle_ray():.1f} s")
                address = context.address_info["gcs_address"]  # type: ignore[attr-defined]
                timed("ray1", "ray, 1 actor",
                      lambda: generate(tmp / "ray1", n, "--executor", "ray", "--ray-address", address))
            finally:
                ray.shutdown()
                shutil.rmtree(ray_tmp, ignore_errors=True)
        med = {key: median_run(runs) for key, runs in rounds.items()}
        env_only, process1 = med["env_only"], med["process1"]
        if not args.ingest_only:
            thread1, thread_b, process_b, ray1 = med["thread1"], med["thread_b"], med["process_b"], med["ray1"]
        packet_bytes_measured = video_bytes_per_frame(tmp / "process1")
        # (c) ---------------------------------------------------------------------------------------
        ingest_episodes = 6 if args.quick else 60
        aloha_packet = round(packet_bytes_measured)
        # 480x640 has 6.1x the pixels of 224x224: packets scaled by that (same content density, same codec).
        big_packet = round(packet_bytes_measured * 480 * 640 / (224 * 224))
        log(f"(c) driver ingest, {ingest_episodes} synthetic episodes; ALOHA packets {aloha_packet} B/frame "
            f"(measured in (a)), 480x640 packets {big_packet} B/frame/camera; load {load()}")
        aloha_in = ingest(tmp / "ingest_aloha", 1, 224, 224, 50, 400, ingest_episodes, workers=8,
                          packet_bytes=aloha_packet)
        log(f"  ALOHA 224x224: {aloha_in['frames_per_s']:.0f} frames/s")
        two_cam = ingest(tmp / "ingest_2cam", 2, 480, 640, 30, 300, max(4, ingest_episodes // 3), workers=8,
                         packet_bytes=big_packet)
        log(f"  2 x 480x640: {two_cam['frames_per_s']:.0f} frames/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}"

    # A worker with a core to itself runs no faster than its env: env-only frames per CPU-second of (a).
    worker_rate = env_only["frames_per_cpu_s"]
    print(f"\n## Scale-out benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"load at the end {load()}; {args.repeat} round(s), medians)\n")
    if not args.ingest_only:
        print("| measurement | wall s | CPU s | CPU utilisation | ratio | target |")
        print("|---|---|---|---|---|---|")
        print(f"| (a) `demoforge run` (env only), {n} ep | {env_only['wall']:.1f} | {env_only['cpu']:.1f} | "
              f"{env_only['util']:.0%} |  |  |")
        print(f"| (a) generate, thread executor, 1 worker | {thread1['wall']:.1f} | {thread1['cpu']:.1f} | "
              f"{thread1['util']:.0%} | {ratio(thread1['wall'], env_only['wall'])} vs env only |  |")
        print(f"| (a) generate, process executor, 1 worker | {process1['wall']:.1f} | {process1['cpu']:.1f} | "
              f"{process1['util']:.0%} | {ratio(process1['wall'], env_only['wall'])} vs env only | <= 1.05 |")
        print(f"| (b) generate, thread executor, 1 worker, {m} ep | {thread_b['wall']:.1f} | {thread_b['cpu']:.1f} | "
              f"{thread_b['util']:.0%} |  |  |")
        print(f"| (b) generate, process executor, 2 workers, {m} ep | {process_b['wall']:.1f} | {process_b['cpu']:.1f} | "
              f"{process_b['util']:.0%} | {ratio(thread_b['wall'], process_b['wall'])}x speed-up | >= 1.4x |")
        print(f"| (d) generate, Ray executor, 1 actor, {n} ep | {ray1['wall']:.1f} | n/a (actors are not children) |  | "
              f"{ratio(ray1['wall'], process1['wall'])} vs process, 1 worker | <= 1.10 |")
        print()
        print("Wall seconds of every round: " + "; ".join(
            f"{key} " + ", ".join(f"{w:.1f}" for w in runs_of["walls"]) for key, runs_of in med.items()))
        print()
        walls = {key: [r["wall"] for r in runs] for key, runs in rounds.items()}
        print("Per-round ratios (each round's command over the same round's baseline; tools/round_ratio.py):")
        print(f"- (a) thread / env only: {round_ratio(walls['thread1'], walls['env_only']).describe()}")
        print(f"- (a) process / env only: {round_ratio(walls['process1'], walls['env_only']).describe(1.05)}")
        print(f"- (b) 2 process workers' wall / 1 thread worker's (speed-up >= 1.4x is <= {1 / 1.4:.3f}): "
              f"{round_ratio(walls['process_b'], walls['thread_b']).describe(round(1 / 1.4, 3))}")
        print(f"- (d) Ray / process: {round_ratio(walls['ray1'], walls['process1']).describe(1.10)}")
        print()
    print("| (c) driver ingest (write + commit only) | frames/s | episodes/s | MB/s of video | video KB/frame/camera "
          "| frames per driver CPU-second | workers served (wall) | workers served (driver CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, measured in (("ALOHA: 1 camera 224x224 AV1, 400-frame episodes", aloha_in),
                            ("2 cameras 480x640 AV1, 300-frame episodes", two_cam)):
        served = (f"{measured['frames_per_s'] / worker_rate:.0f} | {measured['frames_per_cpu_s'] / worker_rate:.0f}"
                  if measured is aloha_in else "n/a (no measured worker for this task) | n/a")
        print(f"| {label} | {measured['frames_per_s']:.0f} | {measured['episodes_per_s']:.2f} | {measured['mb_per_s']:.1f} | "
              f"{measured['video_kb_per_frame']:.1f} | {measured['frames_per_cpu_s']:.0f} | {served} |")
    print()
    busy = aloha_in["busy"]
    print(f"Workers served = ingest rate / {worker_rate:.1f} frames/s, the ALOHA env-only rate per CPU-second in (a) "
          f"(a worker with a core to itself). ALOHA ingest: write busy {busy.get('write', 0):.1f} s, commit busy "
          f"{busy.get('commit', 0):.1f} s, driver CPU {aloha_in['cpu']:.1f} s, of {aloha_in['wall']:.1f} s wall.")


if __name__ == "__main__":
    main()
