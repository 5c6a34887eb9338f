"""Recorder against LeRobot's own writer on the same frames: frames per second and peak memory, in one run.

Each writer records the same episodes (two 240x320 cameras, a 14-D state and action, frames precomputed in
memory so only the writers are timed) in a process of its own, one after the other, rounds interleaved:

- ``lerobot``: ``LeRobotDataset.create(..., streaming_encoding=True)`` then ``add_frame`` / ``save_episode`` /
  ``finalize`` (its fastest path, docs: shared reference lerobot-v3.md);
- ``lerobot-png``: LeRobot's default path (PNG per frame, encoded at ``save_episode``);
- ``recorder``: ``Recorder.create(...)`` with ``publish="save"`` (every save durable and published);
- ``recorder-close``: the same with ``publish="close"``.

Prints frames/s (both cameras per frame) of each, the ratio to ``lerobot``, and peak RSS.

    nice -n 10 .venv/bin/python tools/bench_recorder.py [--episodes 5] [--frames 150] [--codec h264] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KINDS = ("lerobot", "lerobot-png", "recorder", "recorder-close")
HEIGHT, WIDTH = 240, 320


def features() -> dict:
    cam = {"dtype": "video", "shape": (HEIGHT, WIDTH, 3), "names": ["height", "width", "channels"]}
    return {"observation.state": {"dtype": "float32", "shape": (14,), "names": None},
            "action": {"dtype": "float32", "shape": (14,), "names": None},
            "observation.images.top": cam, "observation.images.wrist": cam}


def frames(count: int) -> list[dict]:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    out = []
    for step in range(count):
        image = np.stack([128 + 100 * np.sin(x / 17 + step / 9), 128 + 100 * np.cos(y / 13 + step / 11),
                          128 + 60 * np.sin((x + y) / 23)], axis=-1).astype(np.uint8)
        state = rng.normal(size=14).astype(np.float32)
        out.append({"observation.state": state, "action": state * 0.5, "observation.images.top": image,
                    "observation.images.wrist": image[::-1].copy(), "task": "benchmark"})
    return out


def child(kind: str, root: Path, episodes: int, count: int, codec: str) -> dict:
    data = frames(count)
    # imports before the clock: both writers' libraries (the recorder's export imports pyarrow and lerobot's
    # metadata helpers when it first publishes)
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from demoforge import Recorder
    from demoforge.storage.scheduling import normal_priority
    importlib.import_module("demoforge.storage.lerobot.export")

    started = time.perf_counter()
    if kind.startswith("lerobot"):
        # At normal priority like the recorder (as root, LeRobot's SVT-AV1 threads would run SCHED_FIFO 99).
        with normal_priority():
            dataset = LeRobotDataset.create("bench/x", fps=30, features=features(), root=root, use_videos=True,
                                            rgb_encoder=RGBEncoderConfig(vcodec=codec),
                                            streaming_encoding=kind == "lerobot",
                                            image_writer_threads=0 if kind == "lerobot" else 4)
            for _ in range(episodes):
                for frame in data:
                    dataset.add_frame(dict(frame))  # it pops "task" from the dict it is given
                dataset.save_episode()
            dataset.finalize()
    else:
        with Recorder.create(root, fps=30, features=features(), codec=codec,
                             publish="save" if kind == "recorder" else "close") as recorder:
            for _ in range(episodes):
                for frame in data:
                    recorder.add_frame(dict(frame))
                recorder.save_episode()
    seconds = time.perf_counter() - started
    return {"kind": kind, "seconds": seconds, "fps": episodes * count / seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                     epilog="example:\n  nice -n 10 .venv/bin/python tools/bench_recorder.py --rounds 2")
    parser.add_argument("--episodes", type=int, default=5, help="episodes per writer (default: 5)")
    parser.add_argument("--frames", type=int, default=150, help="frames per episode (default: 150)")
    parser.add_argument("--codec", default="h264", help="h264 or libsvtav1 (default: h264)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every writer (default: 2)")
    parser.add_argument("--child", default=None, help="(internal) the writer this process runs")
    parser.add_argument("--root", type=Path, default=None, help="(internal) where the child writes")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.root, args.episodes, args.frames, args.codec)))
        return 0
    results: dict[str, list[dict]] = {k: [] for k in KINDS}
    work = Path(tempfile.mkdtemp(prefix="bench-recorder-"))
    try:
        for round_ in range(args.rounds):
            for kind in KINDS:
                root = work / f"{kind}-{round_}"
                done = subprocess.run([sys.executable, __file__, "--child", kind, "--root", str(root),
                                       "--episodes", str(args.episodes), "--frames", str(args.frames),
                                       "--codec", args.codec], capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{kind} failed:\n{done.stderr[-3000:]}")
                results[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(root.with_name(root.name + ".store"), ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = np.median([r["fps"] for r in results["lerobot"]])
    print(f"{args.episodes} episodes x {args.frames} frames, two {HEIGHT}x{WIDTH} cameras, {args.codec}, "
          f"{args.rounds} interleaved rounds (medians)")
    print(f"{'writer':16s} {'frames/s':>9s} {'vs lerobot':>10s} {'peak RSS MB':>12s}")
    for kind in KINDS:
        fps = float(np.median([r["fps"] for r in results[kind]]))
        rss = float(np.median([r["peak_rss_mb"] for r in results[kind]]))
        print(f"{kind:16s} {fps:9.1f} {fps / base:10.2f} {rss:12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
