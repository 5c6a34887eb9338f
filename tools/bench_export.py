"""Export throughput: demoforge's export (packet copy + parquet + metadata, statistics read from staging)
against writing the same episodes through LeRobot 0.6.1's own writer (which encodes the frames again and
computes their statistics), same codec settings, side by side in one run; then, with ``--episodes N`` above
``--compare-episodes``, demoforge's per-episode export time from 10 to N pending episodes.

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_export.py [--episodes 1000] [--frames 150]

Side by side: ``--compare-episodes`` (10) episodes of the toy camera task (tests/toy_tasks.py), one 224x224
camera, ``--frames`` (150) frames each, generated into a fresh store first (not timed); the LeRobot writer
gets the raw frames from memory (re-rendered by the deterministic task, not timed), with streaming_encoding
on and off. Every output's video frames are counted back from its mp4 files.

Pending episodes: a few episodes are generated for real, then copied under new episode ids and catalog rows
(real Zarr folders and rows, the same bytes, hashes and statistics: tools/bench_export_memory.py's
``replicate``) into stores of 10, 100, ... and N pending episodes, each exported once into a new dataset.

Both parts run after an untimed warm-up export and LeRobot write in the same process (imports, first-use
costs). CPU seconds (``time.process_time``, every thread) are printed beside wall seconds: on a shared
machine they move less with the load than frames/s do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import toy_tasks  # noqa: E402,F401
from bench_export_memory import replicate  # noqa: E402
from demoforge.pipeline.job import JobSpec, VideoSettings  # noqa: E402
from demoforge.pipeline.runner import run_job  # noqa: E402
from demoforge.pipeline.tasks.registry import get_task  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import Frame  # noqa: E402
from demoforge.storage.lerobot.export import export_store  # noqa: E402
from demoforge.storage.scheduling import normal_priority  # noqa: E402
from demoforge.storage.video import count_frames as count_video_frames  # noqa: E402

SIZE = 224
CODECS = [("h264 veryfast", VideoSettings(codec="h264", crf=23, preset="veryfast"), ("h264", 23, "veryfast")),
          ("AV1 (LeRobot default)", VideoSettings(), ("libsvtav1", 30, 12))]


def raw_episodes(episodes: int, frames: int) -> list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
    """The frames the toy task records (state, action, camera images), re-rendered (the task is deterministic)."""
    options = {"steps": frames, "size": SIZE}
    out: dict[int, tuple[list, list, list]] = {i: ([], [], []) for i in range(episodes)}
    for record in run_episodes(get_task("toy-point").build(options), task="toy-point", episodes=episodes,
                               max_attempts=1):
        if isinstance(record, Frame):
            state, action, images = out[record.key.episode_index]
            state.append(record.state["observation.state"])
            action.append(record.action)
            images.append(record.images["cam"])
    return [(np.stack(s), np.stack(a), i) for s, a, i in out.values()]


def lerobot_write(episodes, root: Path, vcodec: str, crf: int, preset, streaming: bool) -> tuple[float, float]:
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {"observation.state": {"dtype": "float32", "shape": (2,), "names": None},
                "action": {"dtype": "float32", "shape": (1,), "names": None},
                "observation.images.cam": {"dtype": "video", "shape": (SIZE, SIZE, 3),
                                           "names": ["height", "width", "channels"]}}
    started, cpu = time.perf_counter(), time.process_time()
    with normal_priority():  # as demoforge's side runs (as root, LeRobot's SVT-AV1 asks for SCHED_FIFO 99)
        ds = LeRobotDataset.create(repo_id="bench/export", fps=10, features=features, root=root, use_videos=True,
                                   streaming_encoding=streaming,
                                   rgb_encoder=RGBEncoderConfig(vcodec=vcodec, crf=crf, g=2, preset=preset))
        for state, action, images in episodes:
            for t in range(len(action)):
                ds.add_frame({"observation.state": state[t], "action": action[t],
                              "observation.images.cam": images[t], "task": "walk forward, then back"})
            ds.save_episode()
        ds.finalize()
    return time.perf_counter() - started, time.process_time() - cpu


def timed_export(store: Path, out: Path) -> tuple[float, float, int]:
    started, cpu = time.perf_counter(), time.process_time()
    report = export_store(store, out)
    return time.perf_counter() - started, time.process_time() - cpu, report.total_frames


def video_frames(root: Path) -> int:
    return sum(count_video_frames(p.read_bytes()) for p in root.resolve().rglob("*.mp4"))


def loadavg() -> str:
    return "/".join(Path("/proc/loadavg").read_text().split()[:3])


def side_by_side(work: Path, episodes: int, frames: int) -> list[str]:
    total = episodes * frames
    raw = raw_episodes(episodes, frames)
    lines = [f"**Side by side: {episodes} episodes x {frames} frames, one {SIZE}x{SIZE} camera; load average "
             f"before {loadavg()}**", "",
             "| codec | writer | frames/s | seconds | CPU s | video frames / expected | time vs demoforge |",
             "|---|---|---|---|---|---|---|"]
    for label, settings, lr in CODECS:
        base = work / label.split()[0]
        store = base / "store"
        run_job(JobSpec(task="toy-point", episodes=episodes, video=settings,
                        task_options={"steps": frames, "size": SIZE}), store)
        seconds, cpu, exported = timed_export(store, base / "ours")
        assert exported == total, exported
        results = {"demoforge export": (seconds, cpu, video_frames(base / "ours"))}
        for streaming in (True, False):
            root = base / f"lerobot-{streaming}"
            took, took_cpu = lerobot_write(raw, root, *lr, streaming=streaming)
            results[f"LeRobot writer, streaming_encoding={streaming}"] = (took, took_cpu, video_frames(root))
        ours = results["demoforge export"][0]
        for name, (took, took_cpu, video) in results.items():
            lines.append(f"| {label} | {name} | {total / took:,.0f} | {took:.2f} | {took_cpu:.2f} | {video} / {total} | "
                         f"{took / ours:.1f}x |")
        shutil.rmtree(base, ignore_errors=True)
    lines += ["", f"load average after {loadavg()}"]
    return lines


def pending_counts(work: Path, most: int, frames: int) -> list[str]:
    seed = work / "seed"
    run_job(JobSpec(task="toy-point", episodes=4, video=CODECS[0][1], task_options={"steps": frames, "size": SIZE}),
            seed)
    counts = sorted({c for c in (10, 100, 1000, 10000) if c < most} | {most})
    lines = [f"**Pending episodes: {frames} frames each, one {SIZE}x{SIZE} h264 camera (copies of 4 recorded "
             f"episodes); load average before {loadavg()}**", "",
             "| pending episodes | frames | staging s | export s | CPU s | frames/s | ms per episode | vs 10 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    first = None
    for count in counts:
        store = work / f"pending-{count}"
        started = time.perf_counter()
        replicate(seed, store, count)
        staged = time.perf_counter() - started
        seconds, cpu, exported = timed_export(store, work / f"dataset-{count}")
        per = seconds / count * 1000
        first = first or per
        lines.append(f"| {count:,} | {exported:,} | {staged:.1f} | {seconds:.2f} | {cpu:.2f} | {exported / seconds:,.0f} | "
                     f"{per:.1f} | {per / first:.2f}x |")
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(work / f"dataset-{count}.versions", ignore_errors=True)
    lines += ["", f"load average after {loadavg()}"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10,
                        help="most pending episodes exported by demoforge (above --compare-episodes: also the "
                             "per-episode time from 10 pending up to this many; default: 10)")
    parser.add_argument("--compare-episodes", type=int, default=10,
                        help="episodes written side by side by demoforge and LeRobot's writer (default: 10)")
    parser.add_argument("--frames", type=int, default=150, help="frames per episode (default: 150)")
    args = parser.parse_args()
    import lerobot.datasets.lerobot_dataset  # noqa: F401  (import cost is not export cost)

    work = Path(tempfile.mkdtemp(prefix="demoforge-bench-export-"))
    try:
        # Warm-up, untimed: one tiny export and one tiny LeRobot write (lazy imports, codec registration).
        run_job(JobSpec(task="toy-point", episodes=1, video=VideoSettings(codec="h264"),
                        task_options={"steps": 10, "size": SIZE}), work / "warm")
        export_store(work / "warm", work / "warm-ours")
        lerobot_write(raw_episodes(1, 10), work / "warm-lerobot", "h264", 23, "veryfast", streaming=True)
        lines = side_by_side(work, args.compare_episodes, args.frames)
        if args.episodes > args.compare_episodes:
            lines += [""] + pending_counts(work, args.episodes, args.frames)
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
