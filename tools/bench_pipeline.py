#!/usr/bin/env python
"""Pipeline benchmark: does the staged pipeline overlap its stages, and how does it record
compared with LeRobot 0.6.1's own writer?

Run from the repository root::

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_pipeline.py [--quick]

Table (a), on the real default task ``fetch-pick-place`` (cycles=1, image_size=224, same seeds everywhere):
env-only steps/s (executor, frames discarded, rendering included), encode-only frames/s (CameraEncoder with
the default VideoSettings on frames captured from that task into memory), a naive serial loop (step, encode,
stage, in turn), and the pipeline's committed frames/s (``run_job`` on a fresh store).

Table (b), recorder against recorder on the same pre-rendered frames (2 cameras, 480x640, fed from memory so
only recording is timed): demoforge's recording stages (a tiny in-script task whose env hands out the
frames instantly, run through ``run_job``), LeRobot's default writer and LeRobot's streaming writer, with
identical codec options, for h264 and for LeRobot's default AV1; plus the encoder ceiling (plain
CameraEncoder, one thread per camera), frames counted back from every output, and demoforge's peak RSS for
long against short episodes (each in a fresh subprocess of this script; the job's peak, read before the
script reads the episode back to count its frames, which holds the whole video in memory).

Every number in a table is measured in the same invocation; ratios compare numbers of that invocation.
All outputs go to a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import functools
import io
import itertools
import json
import logging
import os
import resource
import shutil
import subprocess
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from demoforge.pipeline.job import JobSpec, VideoSettings  # noqa: E402
from demoforge.pipeline.runner import run_job  # noqa: E402
from demoforge.pipeline.tasks.registry import CameraSpec, TaskEntry, TaskInfo, get_task, register  # noqa: E402
from demoforge.stages.contract import RecordedObservation, Segment  # noqa: E402
from demoforge.stages.camera_encoder import CameraEncoder  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import AttemptEnded, AttemptStarted, Frame  # noqa: E402
from demoforge.storage.scheduling import normal_priority  # noqa: E402
from demoforge.storage.store import open_store  # noqa: E402
from demoforge.storage.staging import StagingLayout, StagingStore  # noqa: E402
from demoforge.storage.video import count_frames as count_video_frames  # noqa: E402

FETCH = "fetch-pick-place"
FETCH_OPTIONS = {"cycles": 1, "image_size": 224}
POOL_TASK = "bench-pool"
POOL_FPS = 30
SEED = 0


# ============================================================================ helpers
def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def count_mp4_frames(path: Path) -> int:
    return count_video_frames(path.read_bytes())


def _cpu_now() -> float:
    """CPU seconds of this process (every thread) plus its waited-for children (LeRobot's encoder pool)."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def measured(fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one measurement; adds its CPU time (all threads and children) per frame."""
    c0 = _cpu_now()
    result = fn(*args, **kwargs)
    cpu = _cpu_now() - c0
    result["cpu_s"] = cpu
    result["cpu_ms_per_frame"] = 1000 * cpu / max(1, result["frames"])
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of repeated runs (the machine is shared: single runs swing by tens of percent)."""
    fps = [r["fps"] for r in runs]
    out = dict(runs[0])
    out.update(fps=statistics.median(fps), fps_min=min(fps), fps_max=max(fps), runs=len(runs),
               seconds=statistics.median(r["seconds"] for r in runs),
               cpu_ms_per_frame=statistics.median(r["cpu_ms_per_frame"] for r in runs),
               all_fps=fps)
    if "dropped" in runs[0]:
        out["dropped"] = sum(r["dropped"] for r in runs)
        out["expected"] = sum(r["expected"] for r in runs)
        out["catalog_frames"] = sum(r["catalog_frames"] for r in runs)
        out["video_frames"] = {k: sum(r["video_frames"][k] for r in runs) for k in runs[0]["video_frames"]}
    return out


def run_rotated(reps: int, jobs: list[tuple[str, Callable[[], dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Run every job ``reps`` times, interleaved and in a rotated order each time, and summarize each."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in jobs}
    for rep in range(reps):
        order = jobs[rep % len(jobs):] + jobs[:rep % len(jobs)]
        for name, job in order:
            log(f"  {name} (run {rep + 1}/{reps}, load {load()})")
            runs[name].append(measured(job))
    return {name: summarize(r) for name, r in runs.items()}


# ============================================================================ table (a): the real task
@dataclass
class Captured:
    """Frames of a one-camera task captured into memory, one list of frames per episode."""

    camera: CameraSpec
    fps: int
    episodes: list[list[np.ndarray]]

    @property
    def frames(self) -> int:
        return sum(len(e) for e in self.episodes)


def capture(task: str, options: Mapping[str, Any], min_frames: int) -> Captured:
    """Run whole episodes of the task (same seeds as the runs below) until ``min_frames`` are in memory."""
    entry = get_task(task)
    info = entry.info(options)
    (camera,) = info.cameras
    env = entry.build(options)
    episodes: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    try:
        for record in run_episodes(env, task=task, episodes=10_000, job_seed=SEED):
            if isinstance(record, AttemptStarted):
                current = []
            elif isinstance(record, Frame):
                current.append(record.images[camera.name])
            elif isinstance(record, AttemptEnded):
                episodes.append(current)
                if sum(len(e) for e in episodes) >= min_frames:
                    break
    finally:
        env.close()
    return Captured(camera, info.fps, episodes)


def bench_env_only(task: str, options: Mapping[str, Any], episodes: int) -> dict[str, Any]:
    """Executor steps per second with rendering, frames discarded; env construction included (as in run_job)."""
    t0 = time.perf_counter()
    env = get_task(task).build(options)
    frames = committed = 0
    try:
        for record in run_episodes(env, task=task, episodes=episodes, job_seed=SEED):
            if isinstance(record, Frame):
                frames += 1
            elif isinstance(record, AttemptEnded) and record.result.committable:
                committed += record.frames
    finally:
        env.close()
    dt = time.perf_counter() - t0
    return {"frames": frames, "committed_frames": committed, "seconds": dt, "fps": frames / dt}


def bench_encode_only(cap: Captured, settings: VideoSettings) -> dict[str, Any]:
    """CameraEncoder on frames already in memory: a fresh encoder per episode, as the encode stage does."""
    t0 = time.perf_counter()
    nbytes = 0
    for episode in cap.episodes:
        enc = CameraEncoder(cap.camera, cap.fps, settings)
        for image in episode:
            nbytes += len(enc.encode(image))
        nbytes += len(enc.finish())
    dt = time.perf_counter() - t0
    return {"frames": cap.frames, "seconds": dt, "fps": cap.frames / dt, "bytes": nbytes}


def bench_serial(task: str, options: Mapping[str, Any], episodes: int, settings: VideoSettings,
                 workdir: Path) -> dict[str, Any]:
    """The naive loop: for each frame step the env, encode it, stage it, in turn; no overlap at all.

    Staging is the pipeline's own (EpisodeWriter chunks, fsync of the episode at its end), so the work is
    the pipeline's minus the catalog and the queues.
    """
    entry = get_task(task)
    info = entry.info(options)
    layout = StagingLayout(state_shapes=info.state_shapes, action_shape=info.action_shape, cameras=info.cameras)
    t0 = time.perf_counter()
    staging = StagingStore(workdir, layout)
    env = entry.build(options)
    frames = committed = 0
    writer = None
    encoders: dict[str, CameraEncoder] = {}
    try:
        for record in run_episodes(env, task=task, episodes=episodes, job_seed=SEED):
            if isinstance(record, AttemptStarted):
                writer = staging.open_episode(record.key.episode_id)
                encoders = {c.name: CameraEncoder(c, info.fps, settings) for c in info.cameras}
            elif isinstance(record, Frame):
                assert writer is not None
                video = {name: encoders[name].encode(img) for name, img in record.images.items()}
                full = writer.add_frame(record.state, record.action, record.reward, record.annotations.as_tuple())
                for name, data in video.items():
                    full |= writer.add_video(name, data)
                if full:
                    writer.flush_full()
                frames += 1
            elif isinstance(record, AttemptEnded):
                assert writer is not None
                if record.result.committable:
                    for name, enc in encoders.items():
                        writer.add_video(name, enc.finish())
                    writer.flush_all()
                    staging.make_durable(record.key.episode_id)
                    committed += record.frames
                else:
                    for enc in encoders.values():
                        enc.abort()
                    staging.delete_episode(record.key.episode_id)
                writer, encoders = None, {}
    finally:
        env.close()
    dt = time.perf_counter() - t0
    shutil.rmtree(workdir, ignore_errors=True)
    return {"frames": frames, "committed_frames": committed, "seconds": dt, "fps": frames / dt}


def bench_pipeline(task: str, options: Mapping[str, Any], episodes: int, settings: VideoSettings,
                   store: Path) -> dict[str, Any]:
    spec = JobSpec(task=task, episodes=episodes, task_options=dict(options), seed=SEED, video=settings)
    report = run_job(spec, store)
    if not report.complete:
        raise RuntimeError(f"pipeline run incomplete: {report}")
    shutil.rmtree(store, ignore_errors=True)
    return {"frames": report.frames_this_run, "seconds": report.elapsed_s,
            "fps": report.frames_this_run / report.elapsed_s, "discarded": report.discarded}


def table_a(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    settings = VideoSettings()  # LeRobot defaults: libsvtav1, crf 30, g 2, preset 12
    load_before = load()
    log(f"(a) capturing >= {args.capture_frames} frames of {FETCH} {FETCH_OPTIONS} into memory")
    cap = capture(FETCH, FETCH_OPTIONS, args.capture_frames)  # also warms imports and the GL stack
    counter = itertools.count()
    eps = args.episodes
    res = run_rotated(args.repeat, [
        ("env-only", lambda: bench_env_only(FETCH, FETCH_OPTIONS, eps)),
        ("encode-only", lambda: bench_encode_only(cap, settings)),
        ("serial", lambda: bench_serial(FETCH, FETCH_OPTIONS, eps, settings, tmp / f"serial-{next(counter)}")),
        ("pipeline", lambda: bench_pipeline(FETCH, FETCH_OPTIONS, eps, settings, tmp / f"store-{next(counter)}")),
    ])
    env, enc, serial, pipe = res["env-only"], res["encode-only"], res["serial"], res["pipeline"]
    if pipe["frames"] != env["committed_frames"]:
        log(f"warning: pipeline committed {pipe['frames']} frames, env-only run committed {env['committed_frames']}")
    bound = min(env["fps"], enc["fps"])
    return {"settings": settings.codec_options() | {"codec": settings.codec}, "episodes": eps,
            "repeat": args.repeat, "captured": {"frames": cap.frames, "episodes": len(cap.episodes)},
            "load_before": load_before, "load_after": load(),
            "env": env, "encode": enc, "serial": serial, "pipeline": pipe,
            "pipeline_vs_bound": pipe["fps"] / bound, "speedup": pipe["fps"] / serial["fps"],
            # serial time / max(env time, encode time) for the same frames = min(env fps, encode fps) / serial fps
            "ideal_speedup": bound / serial["fps"]}


# ============================================================================ table (b): recorders
_POOL: list[np.ndarray] = []  # one (P, H, W, 3) uint8 array per camera, read by the in-script task's env


def make_pool(n: int, height: int, width: int, cameras: int, seed: int = 1) -> list[np.ndarray]:
    """Moving gradients plus mild noise: compressible, but every frame differs."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int32)
    pools = []
    for cam in range(cameras):
        frames = np.empty((n, height, width, 3), dtype=np.uint8)
        for i in range(n):
            shift = 5 * i + 37 * cam
            frames[i, ..., 0] = (xx // 2 + shift) % 256
            frames[i, ..., 1] = (yy // 2 + 3 * i) % 256
            frames[i, ..., 2] = ((xx + yy) // 4 + 7 * i + 90 * cam) % 256
            block = (slice((13 * i) % (height - 64), (13 * i) % (height - 64) + 64),
                     slice((29 * i) % (width - 96), (29 * i) % (width - 96) + 96))
            frames[i][block] = 255 - frames[i][block]  # a moving patch
            frames[i] += rng.integers(0, 6, size=(height, width, 3), dtype=np.uint8)
        pools.append(frames)
    return pools


class PoolEnv(gym.Env):
    """Hands out pre-rendered frames from memory: stepping and 'rendering' cost nothing."""

    metadata = {"render_modes": []}

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.frames = int(options["frames"])
        self.observation_space = gym.spaces.Box(-1e9, 1e9, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1, 1, shape=(1,), dtype=np.float32)
        self.t = 0
        # Non-zero action and reward on purpose: zarr skips chunks equal to the fill value (0), and staging's
        # read-back then reports them missing (see docs/performance.md, "Recording pipeline").
        self._action = np.full(1, 0.5, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, 0.0], np.float32), 1.0, False, False, {}

    def create_demo_segments(self) -> Iterator[Segment]:
        yield Segment(actions=itertools.repeat(self._action, self.frames), name="play")

    def demo_record(self, observation) -> RecordedObservation:
        images = {f"cam{k}": pool[self.t % len(pool)] for k, pool in enumerate(_POOL)}
        return RecordedObservation(state={"observation.state": observation}, images=images)


def _pool_info(options: Mapping[str, Any]) -> TaskInfo:
    _, height, width, _ = _POOL[0].shape
    return TaskInfo(name=POOL_TASK, description="pre-rendered frames from memory", instruction="replay",
                    fps=POOL_FPS, action_shape=(1,), state_shapes={"observation.state": (2,)},
                    cameras=tuple(CameraSpec(f"cam{k}", height, width) for k in range(len(_POOL))),
                    segment_names=("play",), options=dict(options))


register(TaskEntry(name=POOL_TASK, defaults={"frames": 150}, describe=_pool_info,
                   make_env=lambda o: PoolEnv(o)))


def bench_demoforge_recorder(episodes: int, frames: int, settings: VideoSettings, store: Path,
                             encoder_process: bool | None = None) -> dict[str, Any]:
    """demoforge's recording stages (encode -> write -> commit) behind an env that costs nothing; the encoders
    where the job's default puts them (``encoder_process`` None) or as told."""
    spec = JobSpec(task=POOL_TASK, episodes=episodes, task_options={"frames": frames}, seed=SEED, video=settings,
                   encoder_process=encoder_process)
    report = run_job(spec, store)
    if not report.complete:
        raise RuntimeError(f"demoforge run incomplete: {report}")
    return {"fps": report.frames_this_run / report.elapsed_s, "seconds": report.elapsed_s,
            "frames": report.frames_this_run, "expected": episodes * frames, "out": store}


def count_demoforge(result: dict[str, Any]) -> dict[str, Any]:
    """What the store holds: catalog frames per episode, and the staged videos' frames (demuxed, checksummed)."""
    store = result.pop("out")
    with open_store(store) as view:
        rows = view.committed()
        _fingerprint, staging = view.require_job()
        video_frames = {c: 0 for c in staging.layout.camera_names}
        for row in rows:
            staged = staging.read_episode(row.episode_id, row.frames or 0, row.video_bytes)
            for cam, data in staged.video.items():
                video_frames[cam] += count_video_frames(data)
        catalog_frames = sum(r.frames or 0 for r in rows)
    shutil.rmtree(store, ignore_errors=True)
    return _with_drops(result, catalog_frames, video_frames)


def _with_drops(result: dict[str, Any], catalog_frames: int, video_frames: dict[str, int]) -> dict[str, Any]:
    expected = result["expected"]
    result.update(catalog_frames=catalog_frames, video_frames=video_frames,
                  dropped=sum(expected - n for n in video_frames.values()) + (expected - catalog_frames))
    return result


def bench_lerobot_recorder(episodes: int, frames: int, rgb_encoder: Any, streaming: bool,
                           root: Path) -> dict[str, Any]:
    """LeRobot 0.6.1's writer: create(), add_frame() per frame, save_episode() per episode, finalize()."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    _, height, width, _ = _POOL[0].shape
    keys = [f"observation.images.cam{k}" for k in range(len(_POOL))]
    features: dict[str, Any] = {key: {"dtype": "video", "shape": (height, width, 3),
                                      "names": ["height", "width", "channels"]} for key in keys}
    features["observation.state"] = {"dtype": "float32", "shape": (2,), "names": None}
    features["action"] = {"dtype": "float32", "shape": (1,), "names": None}
    action = np.full(1, 0.5, dtype=np.float32)
    t0 = time.perf_counter()
    # At normal priority like demoforge's side: as root, LeRobot's SVT-AV1 threads (and the thread that opens
    # its encoder, for every later run of this process) would otherwise run SCHED_FIFO 99.
    with normal_priority():
        ds = LeRobotDataset.create(repo_id="bench/recorder", fps=POOL_FPS, features=features, root=root,
                                   use_videos=True, streaming_encoding=streaming, rgb_encoder=rgb_encoder)
        for _ in range(episodes):
            for t in range(frames):
                frame: dict[str, Any] = {key: _POOL[k][t % len(_POOL[k])] for k, key in enumerate(keys)}
                frame["observation.state"] = np.array([t, 0.0], np.float32)
                frame["action"] = action
                frame["task"] = "replay"
                ds.add_frame(frame)
            ds.save_episode()
        ds.finalize()
    dt = time.perf_counter() - t0
    del ds
    total = episodes * frames
    return {"fps": total / dt, "seconds": dt, "frames": total, "expected": total, "out": root, "keys": keys}


def count_lerobot(result: dict[str, Any]) -> dict[str, Any]:
    """What LeRobot wrote: meta/info.json total_frames, and the mp4s' frames (demuxed) per camera."""
    root, keys = result.pop("out"), result.pop("keys")
    info = json.loads((root / "meta" / "info.json").read_text())
    video_frames = {key: sum(count_mp4_frames(p) for p in sorted((root / "videos" / key).rglob("*.mp4")))
                    for key in keys}
    shutil.rmtree(root, ignore_errors=True)
    return _with_drops(result, int(info["total_frames"]), video_frames)


def bench_encoder_ceiling(episodes: int, frames: int, settings: VideoSettings) -> dict[str, Any]:
    """Plain CameraEncoder, one thread per camera, same frames: what encoding alone allows."""
    _, height, width, _ = _POOL[0].shape
    errors: list[BaseException] = []

    def one(cam: int) -> None:
        try:
            pool = _POOL[cam]
            spec = CameraSpec(f"cam{cam}", height, width)
            for _ in range(episodes):
                enc = CameraEncoder(spec, POOL_FPS, settings)
                for t in range(frames):
                    enc.encode(pool[t % len(pool)])
                enc.finish()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(_POOL))]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return {"fps": episodes * frames / dt, "seconds": dt, "frames": episodes * frames}


def codec_cases(args: argparse.Namespace) -> list[tuple[str, VideoSettings, dict[str, Any]]]:
    """(label, demoforge settings, LeRobot RGBEncoderConfig kwargs) with identical codec options."""
    cases = [(f"h264 {p}", VideoSettings(codec="h264", crf=23, g=2, preset=p),
              {"vcodec": "h264", "crf": 23, "g": 2, "preset": p}) for p in args.h264_presets]
    cases.append(("AV1 (LeRobot default)", VideoSettings(codec="libsvtav1", crf=30, g=2, preset=12),
                  {"vcodec": "libsvtav1", "crf": 30, "g": 2, "preset": 12}))
    return cases


def quiet_ffmpeg() -> None:
    """LeRobot's encoder threads restore FFmpeg's own log callback (libx264 then prints its statistics)."""
    import av

    av.logging.set_level(None)
    av.logging.set_libav_level(av.logging.ERROR)


def table_b(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import datasets
    from lerobot.configs.video import RGBEncoderConfig

    datasets.disable_progress_bars()
    logging.getLogger("lerobot").setLevel(logging.ERROR)  # streaming drops are counted from the outputs
    quiet_ffmpeg()
    load_before = load()
    log(f"(b) building a pool of {args.pool} frames x 2 cameras of 480x640")
    _POOL[:] = make_pool(args.pool, 480, 640, 2)
    eps, frames = args.b_episodes, args.b_frames
    results: dict[str, Any] = {"episodes": eps, "frames_per_episode": frames, "repeat": args.repeat_b,
                               "cases": {}, "load_before": load_before}
    counter = itertools.count()

    def demoforge(settings: VideoSettings) -> dict[str, Any]:
        return bench_demoforge_recorder(eps, frames, settings, tmp / f"df-{next(counter)}")

    def lerobot(kwargs: dict[str, Any], streaming: bool) -> dict[str, Any]:
        quiet_ffmpeg()
        return bench_lerobot_recorder(eps, frames, RGBEncoderConfig(**kwargs), streaming, tmp / f"lr-{next(counter)}")

    def counted_demoforge(settings: VideoSettings) -> dict[str, Any]:
        return count_demoforge(demoforge(settings))

    def counted_lerobot(kwargs: dict[str, Any], streaming: bool) -> dict[str, Any]:
        return count_lerobot(lerobot(kwargs, streaming))

    for label, settings, lr_kwargs in codec_cases(args):
        ours, theirs = settings.codec_options(), RGBEncoderConfig(**lr_kwargs).get_codec_options(as_strings=True)
        if ours != theirs:
            raise RuntimeError(f"{label}: codec options differ: demoforge {ours}, LeRobot {theirs}")
        log(f"(b) {label}: demoforge, LeRobot streaming writer, encoder ceiling x{args.repeat_b}; then LeRobot's "
            "default writer once")
        res = run_rotated(args.repeat_b, [
            ("demoforge", functools.partial(counted_demoforge, settings)),
            ("lerobot streaming", functools.partial(counted_lerobot, lr_kwargs, True)),
            ("encoder ceiling", functools.partial(bench_encoder_ceiling, eps, frames, settings)),
        ])
        res |= run_rotated(1, [("lerobot default", functools.partial(counted_lerobot, lr_kwargs, False))])
        results["cases"][label] = {"codec": settings.codec, "options": ours, **res}
        quiet_ffmpeg()
    _POOL.clear()
    results["load_after"] = load()

    log("(b) peak RSS: short against long episodes, each in a fresh subprocess")
    results["rss"] = {n: rss_child(n) for n in (args.rss_short, args.rss_long)}
    return results


# ============================================================================ peak RSS (subprocess)
def rss_child(frames: int) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", str(frames)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if out.returncode != 0:
        raise RuntimeError(f"peak-RSS subprocess ({frames} frames) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rss_child_main(frames: int) -> None:
    """A 224x224 one-camera h264 toy job with one episode of ``frames`` frames; prints peak RSS as JSON: the
    job's (read when it returns) and the whole process's, which adds this script reading every staged video
    back into memory to count its frames (that grows with the episode by design and is not the recorder's)."""
    _POOL[:] = make_pool(32, 224, 224, 1)
    with tempfile.TemporaryDirectory(prefix="bench-rss-") as tmp:
        settings = VideoSettings(codec="h264", crf=23, g=2, preset="veryfast")
        job = bench_demoforge_recorder(1, frames, settings, Path(tmp) / "store")
        job_peak = peak_rss_kib()
        result = count_demoforge(job)
    print(json.dumps({"frames": frames, "committed": result["frames"], "dropped": result["dropped"],
                      "seconds": result["seconds"], "maxrss_mib": job_peak / 1024,
                      "with_count_mib": peak_rss_kib() / 1024}))


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM).

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the pre-exec high-water mark into it, and
    subprocess's vfork/exec makes that the parent's (here over 1 GiB with torch loaded).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ============================================================================ output
def render(a: dict[str, Any] | None, b: dict[str, Any] | None, markdown: bool) -> str:
    tables: list[tuple[str, list[str], list[list[str]]]] = []

    def spread(r: dict[str, Any]) -> str:
        return f"{fmt(r['fps_min'])}-{fmt(r['fps_max'])}" if r["runs"] > 1 else ""

    if a is not None:
        env, enc, serial, pipe = a["env"], a["encode"], a["serial"], a["pipeline"]

        def row(name: str, r: dict[str, Any]) -> list[str]:
            return [name, fmt(r["fps"]), spread(r), fmt(r["cpu_ms_per_frame"]),
                    f"{r['frames']} frames in {r['seconds']:.1f} s", ""]

        rows = [
            row("env-only: executor + rendering, frames discarded", env),
            row("encode-only: CameraEncoder on captured frames", enc),
            row("naive serial loop: step, encode, stage in turn", serial),
            row("pipeline: run_job, committed frames", pipe),
            ["pipeline / min(env-only, encode-only)", pct(a["pipeline_vs_bound"]), "", "", "",
             f">= 85%: {verdict(a['pipeline_vs_bound'] >= 0.85)}"],
            ["pipeline speed-up over serial", f"{a['speedup']:.2f}x", "", "",
             f"ideal overlap (serial time / max(env, encode time)) {a['ideal_speedup']:.2f}x", ""],
        ]
        title = (f"(a) {FETCH} cycles=1 image_size=224, {a['episodes']} episodes per run (seed {SEED}), median "
                 f"of {a['repeat']} interleaved runs; encode-only on {a['captured']['frames']} captured frames; "
                 f"video {a['settings']['codec']} "
                 f"{', '.join(f'{k}={v}' for k, v in a['settings'].items() if k != 'codec')}; "
                 f"load avg before {a['load_before']}, after {a['load_after']}")
        tables.append((title, ["measurement", "frames/s", "range", "CPU ms/frame", "detail", "target"], rows))
    if b is not None:
        rows = []

        def dropped(r: dict[str, Any]) -> str:
            per_cam = "/".join(str(r["expected"] - n) for n in r["video_frames"].values())
            return f"{r['dropped']} of {r['expected']} (video {per_cam}, rows {r['expected'] - r['catalog_frames']})"

        for label, case in b["cases"].items():
            df, ls = case["demoforge"], case["lerobot streaming"]
            ld, ceil = case["lerobot default"], case["encoder ceiling"]
            r_stream, r_default = df["fps"] / ls["fps"], df["fps"] / ld["fps"]
            av1 = case["codec"] == "libsvtav1"
            need = 1.25 if av1 else 1.5
            rows.append([label, "demoforge (run_job)", fmt(df["fps"]), spread(df), fmt(df["cpu_ms_per_frame"]),
                         dropped(df), ""])
            rows.append(["", "LeRobot, streaming_encoding=True", fmt(ls["fps"]), spread(ls),
                         fmt(ls["cpu_ms_per_frame"]), dropped(ls),
                         f"demoforge / streaming = {r_stream:.2f}x (>= {need}x: {verdict(r_stream >= need)})"])
            rows.append(["", "LeRobot, default writer (1 run)", fmt(ld["fps"]), "", fmt(ld["cpu_ms_per_frame"]),
                         dropped(ld), f"demoforge / default = {r_default:.2f}x"
                         + (f" (>= 4x: {verdict(r_default >= 4)})" if av1 else "")])
            rows.append(["", "encoder ceiling: CameraEncoder, 2 threads", fmt(ceil["fps"]), spread(ceil),
                         fmt(ceil["cpu_ms_per_frame"]), "", f"demoforge = {pct(df['fps'] / ceil['fps'])} of it"])
        short, long_ = b["rss"][min(b["rss"])], b["rss"][max(b["rss"])]
        growth = long_["maxrss_mib"] / short["maxrss_mib"] - 1
        counted = {n: r.get("with_count_mib") for n, r in ((short["frames"], short), (long_["frames"], long_))}
        rows.append(["peak RSS (VmHWM) of the job", f"demoforge, 1 episode of {short['frames']} frames",
                     f"{short['maxrss_mib']:.0f} MiB", "", "", f"{short['dropped']} of {short['frames']}",
                     f"with the read-back: {counted[short['frames']]:.0f} MiB" if counted[short["frames"]] else ""])
        rows.append(["", f"demoforge, 1 episode of {long_['frames']} frames", f"{long_['maxrss_mib']:.0f} MiB", "", "",
                     f"{long_['dropped']} of {long_['frames']}",
                     f"{growth:+.1%} (within 10%: {verdict(abs(growth) <= 0.10)})"
                     + (f"; with the read-back: {counted[long_['frames']]:.0f} MiB" if counted[long_["frames"]] else "")])
        title = (f"(b) recorders on the same pre-rendered frames: 2 cameras 480x640 from memory, {b['episodes']} "
                 f"episodes x {b['frames_per_episode']} frames per run; frames/s counts frames (both cameras), median "
                 f"of {b['repeat']} interleaved runs except LeRobot's default writer; dropped frames summed over runs; "
                 f"peak RSS: toy task 224x224, one camera, h264 veryfast, fresh subprocess each; "
                 f"load avg before {b['load_before']}, after {b['load_after']}")
        tables.append((title, ["codec", "recorder", "frames/s", "range", "CPU ms/frame", "dropped frames",
                               "ratio / target"], rows))

    if markdown:
        out = []
        for title, header, rows in tables:
            out.append(f"**{title}**\n")
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out += ["| " + " | ".join(r) + " |" for r in rows]
            out.append("")
        return "\n".join(out)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        return "\n\n".join(title + "\n" + "\n".join("  ".join(r) for r in [header, *rows])
                           for title, header, rows in tables)
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False)
    for title, header, rows in tables:
        table = Table(title=title, title_justify="left")
        for h in header:
            table.add_column(h)
        for r in rows:
            table.add_row(*r)
        console.print(table)
    return buf.getvalue()


# ============================================================================ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small run (about a minute): fewer episodes and frames")
    p.add_argument("--only", choices=("a", "b"), help="run only one table")
    p.add_argument("--episodes", type=int, help="table (a): episodes per run (default 5; --quick 2)")
    p.add_argument("--repeat", type=int, help="table (a): interleaved runs of each measurement (default 3; --quick 1)")
    p.add_argument("--repeat-b", type=int,
                   help="table (b): runs of demoforge, LeRobot streaming and the ceiling (default 2; --quick 1)")
    p.add_argument("--capture-frames", type=int, help="table (a): frames captured for encode-only (default 200)")
    p.add_argument("--b-episodes", type=int, help="table (b): episodes per recorder (default 3; --quick 1)")
    p.add_argument("--b-frames", type=int, help="table (b): frames per episode (default 120; --quick 60)")
    p.add_argument("--pool", type=int, help="table (b): distinct pre-rendered frames per camera (default 48)")
    p.add_argument("--h264-presets", default="ultrafast",
                   help="table (b): comma-separated x264 presets to compare (default ultrafast)")
    p.add_argument("--rss-frames", default=None, help="peak RSS: SHORT,LONG episode lengths (default 200,2000)")
    p.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    p.add_argument("--json", type=Path, help="write every measurement to this JSON file")
    p.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.episodes = args.episodes or (2 if q else 5)
    args.repeat = args.repeat or (1 if q else 3)
    args.repeat_b = args.repeat_b or (1 if q else 2)
    args.capture_frames = args.capture_frames or (80 if q else 200)
    args.b_episodes = args.b_episodes or (1 if q else 3)
    args.b_frames = args.b_frames or (60 if q else 120)
    args.pool = args.pool or (16 if q else 48)
    args.h264_presets = [s.strip() for s in args.h264_presets.split(",") if s.strip()]
    short, long_ = (int(x) for x in (args.rss_frames or ("100,1000" if q else "200,2000")).split(","))
    args.rss_short, args.rss_long = short, long_
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_child is not None:
        rss_child_main(args.rss_child)
        return 0
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="demoforge-bench-"))
    a = b = None
    try:
        if args.only in (None, "a"):
            (tmp / "a").mkdir()
            a = table_a(args, tmp / "a")
            shutil.rmtree(tmp / "a", ignore_errors=True)
        if args.only in (None, "b"):
            (tmp / "b").mkdir()
            b = table_b(args, tmp / "b")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"done in {time.perf_counter() - started:.0f} s")
    print(render(a, b, markdown=False))
    if args.markdown:
        print(render(a, b, markdown=True))
    if args.json:
        args.json.write_text(json.dumps({"a": a, "b": b}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
