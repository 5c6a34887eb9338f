"""Export throughput: demoforge's export (remux, no re-encoding) against writing the same episodes through
LeRobot 0.6.1's own writer (which encodes the frames again), same codec settings, measured in one run.

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_export.py [--episodes 6] [--frames 150]

Episodes come from the toy camera task (tests/toy_tasks.py), 224x224, generated into a fresh store first
(not timed). The LeRobot writer gets the decoded staged frames from memory (decoding not timed), with
streaming_encoding on and off. Both exports are loaded back with LeRobotDataset to check their frame counts.
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

import numpy as np  # noqa: E402

import toy_tasks  # noqa: E402,F401
from demoforge.pipeline.job import JobSpec, VideoSettings  # noqa: E402
from demoforge.pipeline.runner import run_job  # noqa: E402
from demoforge.storage.lerobot_export import export_store  # noqa: E402
from demoforge.storage.reader import open_store_reader  # noqa: E402
from demoforge.storage.video import count_frames as count_video_frames  # noqa: E402
from demoforge.storage.video import decode_frames  # noqa: E402


def staged_frames(store: Path) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out = []
    with open_store_reader(store) as view:
        _fingerprint, staging = view.require_job()
        for row in view.catalog.committed():
            ep = staging.read_episode(row.episode_id, row.frames or 0, row.video_bytes)
            out.append((ep.state["observation.state"], ep.action, decode_frames(ep.video["cam"])))
    return out


def lerobot_write(episodes, root: Path, vcodec: str, crf: int, preset, streaming: bool) -> float:
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    h, w = episodes[0][2].shape[1:3]
    features = {"observation.state": {"dtype": "float32", "shape": (2,), "names": None},
                "action": {"dtype": "float32", "shape": (1,), "names": None},
                "observation.images.cam": {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]}}
    started = time.perf_counter()
    ds = LeRobotDataset.create(repo_id="bench/export", fps=10, features=features, root=root, use_videos=True,
                               streaming_encoding=streaming,
                               rgb_encoder=RGBEncoderConfig(vcodec=vcodec, crf=crf, g=2, preset=preset))
    for state, action, images in episodes:
        for t in range(len(action)):
            ds.add_frame({"observation.state": state[t], "action": action[t], "observation.images.cam": images[t],
                          "task": "walk forward, then back"})
        ds.save_episode()
    ds.finalize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--frames", type=int, default=150)
    args = parser.parse_args()
    import lerobot.datasets.lerobot_dataset  # noqa: F401  (import cost is not export cost)

    # Warm-up, untimed: one tiny export and one tiny LeRobot write, so neither side's timed run pays this
    # process's first-use costs (lazy imports of datasets/pyarrow/stats helpers, codec registration).
    warm = Path(tempfile.mkdtemp(prefix="demoforge-bench-export-warm-"))
    try:
        run_job(JobSpec(task="toy-point", episodes=1, video=VideoSettings(codec="h264"),
                        task_options={"steps": 10, "size": 224}), warm / "store")
        export_store(warm / "store", warm / "ours")
        lerobot_write(staged_frames(warm / "store"), warm / "lerobot", "h264", 23, "veryfast", streaming=True)
    finally:
        shutil.rmtree(warm, ignore_errors=True)

    rows = []
    for label, settings, lr in [("h264 veryfast", VideoSettings(codec="h264", crf=23, preset="veryfast"),
                                 ("h264", 23, "veryfast")),
                                ("AV1 (LeRobot default)", VideoSettings(), ("libsvtav1", 30, 12))]:
        tmp = Path(tempfile.mkdtemp(prefix="demoforge-bench-export-"))
        try:
            store = tmp / "store"
            run_job(JobSpec(task="toy-point", episodes=args.episodes, video=settings,
                            task_options={"steps": args.frames, "size": 224}), store)
            total = args.episodes * args.frames
            started = time.perf_counter()
            report = export_store(store, tmp / "ours")
            ours = time.perf_counter() - started
            assert report.total_frames == total
            video = sum(count_video_frames(p.read_bytes()) for p in (tmp / "ours").resolve().rglob("*.mp4"))
            episodes = staged_frames(store)
            results = {"demoforge export (remux)": (ours, video)}
            for streaming in (True, False):
                root = tmp / f"lerobot-{streaming}"
                seconds = lerobot_write(episodes, root, *lr, streaming=streaming)
                video = sum(count_video_frames(p.read_bytes()) for p in root.rglob("*.mp4"))
                results[f"LeRobot writer, streaming_encoding={streaming}"] = (seconds, video)
            base = results["demoforge export (remux)"][0]
            for name, (seconds, video) in results.items():
                rows.append((label, name, total / seconds, seconds, video, total, seconds / base))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.episodes} episodes x {args.frames} frames, one 224x224 camera")
    print(f"| codec | writer | frames/s | seconds | video frames / expected | time vs demoforge |")
    print("|---|---|---|---|---|---|")
    for label, name, fps, seconds, video, total, ratio in rows:
        print(f"| {label} | {name} | {fps:.0f} | {seconds:.1f} | {video} / {total} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
