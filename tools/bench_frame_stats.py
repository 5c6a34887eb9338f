"""What recording a camera's LeRobot statistics costs the encoder: ``CameraEncoder`` alone against
``RecordingEncoder`` (the same encoder, keeping the frames LeRobot's statistics sample and computing them when
the attempt ends), on the same frames, and LeRobot's own ``get_feature_stats`` on the sampled frames.

    .venv/bin/python tools/bench_frame_stats.py [--frames 150] [--size 224] [--codec h264] [--repeat 3]

Frames are moving gradients with noise (compressible like rendered scenes, never identical), from memory.
CPU ms per frame is process CPU (every thread, the codec's included) over the attempt; "finish" is the time
``finish()`` takes (for the recording encoder: reading the sampled frames back and summing them). Runs are
interleaved; medians are printed. The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from demoforge.pipeline.job import VideoSettings
from demoforge.pipeline.tasks.registry import CameraSpec
from demoforge.stages.camera_encoder import CameraEncoder, RecordingEncoder
from demoforge.storage.lerobot_stats import sample_indices, strided


def frames_of(count: int, height: int, width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width]
    return [np.clip(np.stack([(xx + 3 * t) % 256, (yy + 2 * t) % 256, (xx + yy) // 4 % 256], axis=-1)
                    + rng.integers(-8, 8, (height, width, 3)), 0, 255).astype(np.uint8) for t in range(count)]


def run(make, frames: list[np.ndarray]) -> tuple[float, float]:
    cpu = time.process_time()
    encoder = make()
    for image in frames:
        encoder.encode(image)
    mark = time.perf_counter()
    encoder.finish()
    return (time.process_time() - cpu) / len(frames) * 1000, time.perf_counter() - mark


def loadavg() -> str:
    return "/".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=150, help="frames per attempt (default: 150)")
    parser.add_argument("--size", default="224", help="HEIGHTxWIDTH or one number (default: 224)")
    parser.add_argument("--codec", default="h264", help="h264 or libsvtav1 (default: h264)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs of each (default: 3)")
    args = parser.parse_args()
    height, _, width = args.size.partition("x")
    camera = CameraSpec("cam", int(height), int(width or height))
    settings = VideoSettings(codec=args.codec)
    frames = frames_of(args.frames, camera.height, camera.width)
    print(f"{args.frames} frames {camera.height}x{camera.width}, {args.codec}; load average before {loadavg()}")
    results: dict[str, list[tuple[float, float]]] = {"CameraEncoder": [], "RecordingEncoder": []}
    for _ in range(args.repeat):
        results["CameraEncoder"].append(run(lambda: CameraEncoder(camera, 10, settings), frames))
        results["RecordingEncoder"].append(run(lambda: RecordingEncoder(CameraEncoder(camera, 10, settings)),
                                               frames))
    from lerobot.datasets.compute_stats import get_feature_stats

    sampled = np.stack([strided(frames[i]) for i in sample_indices(len(frames))]).transpose(0, 3, 1, 2)
    started = time.perf_counter()
    get_feature_stats(sampled, axis=(0, 2, 3), keepdims=True)
    lerobot_s = time.perf_counter() - started
    print("| encoder | CPU ms/frame | finish s |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(r[0] for r in runs):.2f} | {statistics.median(r[1] for r in runs):.3f} |")
    plain = statistics.median(r[0] for r in results["CameraEncoder"])
    recording = statistics.median(r[0] for r in results["RecordingEncoder"])
    print(f"| statistics' cost | {recording - plain:.2f} ({(recording - plain) / plain:+.0%}) | |")
    print(f"| LeRobot's get_feature_stats on the {len(sampled)} sampled frames | | {lerobot_s:.3f} |")
    print(f"load average after {loadavg()}")


if __name__ == "__main__":
    main()
