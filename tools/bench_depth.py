#!/usr/bin/env python
"""Depth benchmark: what recording a depth camera next to the RGB camera costs, on the same episodes.

Run from the repository root::

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_depth.py [--episodes 3] [--image-size 224]

For ``fetch-pick-place`` (cycles=1, the same episodes and seeds in every row) it runs the whole pipeline
(``JobRunner`` on a fresh store) with ``depth=false`` and with ``depth=true``, interleaved, ``--repeat`` times
each, and prints per row: committed frames/s (median and range over the repeats), process CPU ms per frame
(all threads; hardly depends on the machine's other load, unlike frames/s), each stage's busy seconds per
frame, and the depth of every inter-stage queue sampled every 20 ms (mean and max; a stalled encoder holds
its env worker back). A second table times the encoders alone on frames captured
from one episode: RGB (the job's codec) against depth (LeRobot's quantizer + lossless x265 gray12le).

The lerobot/torch import that a depth job needs (LeRobot's quantizer) is done once before timing: it is a
one-off start-up cost of a depth job, not a per-frame one. Every number of a table comes from the same
invocation; the load average is printed with each table (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from demoforge.pipeline.job import JobSpec, VideoSettings  # noqa: E402
from demoforge.pipeline.runner import JobRunner  # noqa: E402
from demoforge.pipeline.tasks.registry import get_task  # noqa: E402
from demoforge.stages.camera_encoder import make_encoder  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import Frame  # noqa: E402
from demoforge.storage.depth import lerobot_depth_identity, quantize  # noqa: E402

TASK = "fetch-pick-place"


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_pipeline(spec: JobSpec, store: Path, sample_s: float = 0.02) -> dict[str, Any]:
    """One job on a fresh store, with the inter-stage queues sampled while it runs."""
    runner = JobRunner(spec, store)
    samples: dict[str, list[int]] = {}

    async def main() -> Any:
        report: Any = None

        async def job() -> None:
            nonlocal report
            report = await runner.run()

        async with anyio.create_task_group() as tg:
            tg.start_soon(job)
            while report is None:
                for name, depth in runner.stats.queue_depths().items():
                    samples.setdefault(name, []).append(depth)
                await anyio.sleep(sample_s)
        return report

    cpu0 = cpu_s()
    report = anyio.run(main)
    cpu = cpu_s() - cpu0
    frames = report.frames_this_run
    return {"frames": frames, "fps": frames / report.elapsed_s, "cpu_ms": 1000 * cpu / max(frames, 1),
            "busy_ms": {k: 1000 * v / max(frames, 1) for k, v in sorted(runner.stats.busy.snapshot().items())},
            "queues": {k: (float(np.mean(v)), int(max(v))) for k, v in samples.items() if v},
            "committed": report.committed_this_run}


def table_pipeline(args: argparse.Namespace, tmp: Path) -> None:
    rows: dict[str, list[dict[str, Any]]] = {"depth off": [], "depth on": []}
    for r in range(args.repeat):
        for label in (list(rows) if r % 2 == 0 else list(rows)[::-1]):  # alternate the order
            options = {"cycles": 1, "image_size": args.image_size, "depth": label == "depth on"}
            spec = JobSpec(task=TASK, episodes=args.episodes, task_options=options,
                           video=VideoSettings(codec=args.codec), queue_frames=args.queue_frames)
            store = tmp / f"{label.replace(' ', '_')}_{r}"
            rows[label].append(run_pipeline(spec, store))
            shutil.rmtree(store)
            print(f"  {label} run {r + 1}/{args.repeat}: {rows[label][-1]['frames']} frames, "
                  f"{rows[label][-1]['fps']:.1f} frames/s (load {load()})", flush=True)
    print(f"\nPipeline, {TASK} cycles=1 image_size={args.image_size}, {args.episodes} episodes (same seeds), "
          f"RGB codec {args.codec}, queue_frames={args.queue_frames}, {args.repeat} run(s) each; load {load()}")
    head = ("| run | frames | frames/s median (range) | CPU ms/frame | busy ms/frame per stage | "
            "queue depth mean/max |")
    print(head)
    print("|" + "---|" * 6)
    base = statistics.median(r["fps"] for r in rows["depth off"])
    for label, runs in rows.items():
        fps = [r["fps"] for r in runs]
        last = runs[-1]
        busy = ", ".join(f"{k} {statistics.median(r['busy_ms'].get(k, 0.0) for r in runs):.1f}"
                         for k in last["busy_ms"])
        queues = ", ".join(f"{k} {statistics.median(r['queues'][k][0] for r in runs):.1f}/"
                           f"{max(r['queues'][k][1] for r in runs)}" for k in last["queues"])
        print(f"| {label} | {last['frames']} | {statistics.median(fps):.1f} ({min(fps):.1f}-{max(fps):.1f}), "
              f"x{statistics.median(fps) / base:.2f} | {statistics.median(r['cpu_ms'] for r in runs):.1f} | "
              f"{busy} | {queues} |")


def table_encoders(args: argparse.Namespace) -> None:
    entry = get_task(TASK)
    options = {"cycles": 1, "image_size": args.image_size, "depth": True}
    info = entry.info(options)
    env = entry.build(options)
    rgb_frames: list[np.ndarray] = []
    depth_frames: list[np.ndarray] = []
    try:
        for record in run_episodes(env, task=TASK, episodes=1, max_attempts=1, cameras=info.cameras):
            if isinstance(record, Frame):
                rgb_frames.append(record.images["front"])
                depth_frames.append(record.images["front_depth"])
    finally:
        env.close()
    settings = VideoSettings(codec=args.codec)
    identity = lerobot_depth_identity()
    results = {}
    for camera, frames in zip(info.cameras, (rgb_frames, depth_frames)):
        times = []
        for _ in range(args.repeat):
            encoder = make_encoder(camera, info.fps, settings)
            t0 = time.perf_counter()
            size = sum(len(encoder.encode(f)) for f in frames) + len(encoder.finish())
            times.append(time.perf_counter() - t0)
        results[camera.name] = (statistics.median(times), size)
    t0 = time.perf_counter()
    for f in depth_frames:
        quantize(f, identity)
    quant_ms = 1000 * (time.perf_counter() - t0) / len(depth_frames)
    n = len(rgb_frames)
    print(f"\nEncoders alone, {n} frames of one episode at {args.image_size}x{args.image_size}, median of "
          f"{args.repeat}; load {load()}")
    print("| camera | encoder | frames/s | ms/frame | bytes/frame |")
    print("|---|---|---|---|---|")
    for camera in info.cameras:
        seconds, size = results[camera.name]
        what = (f"depth: LeRobot quantize_depth + {identity.codec} {identity.pix_fmt} "
                f"({identity.extra_options.get('x265-params', '')}); quantize alone {quant_ms:.2f} ms/frame"
                if camera.is_depth else f"RGB: {settings.codec} {settings.pix_fmt}")
        print(f"| {camera.name} | {what} | {n / seconds:.1f} | {1000 * seconds / n:.2f} | {size / n:.0f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: tools/bench_depth.py --episodes 3 --image-size 224 --repeat 2")
    p.add_argument("--episodes", type=int, default=3, help="episodes per pipeline run (default 3)")
    p.add_argument("--image-size", type=int, default=224, help="camera side in pixels (default 224)")
    p.add_argument("--repeat", type=int, default=2, help="runs of each row, interleaved (default 2)")
    p.add_argument("--codec", default="h264", help="the RGB camera's codec (default h264)")
    p.add_argument("--queue-frames", type=int, default=32, help="bound of each inter-stage queue (default 32)")
    p.add_argument("--only", choices=("pipeline", "encoders"), help="run one table only (default: both)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    lerobot_depth_identity()  # the one-off lerobot/torch import of a depth job, outside the timings
    quantize(np.ones((4, 4), np.float32), lerobot_depth_identity())
    print(f"lerobot import (one-off per depth job process): {time.perf_counter() - t0:.1f} s; load {load()}")
    with tempfile.TemporaryDirectory(prefix="bench_depth_") as tmp:
        if args.only in (None, "pipeline"):
            table_pipeline(args, Path(tmp))
        if args.only in (None, "encoders"):
            table_encoders(args)


if __name__ == "__main__":
    main()
