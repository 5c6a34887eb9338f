"""Measure the PSNR `demoforge replay --images` sees: re-rendered frames against their stored (lossy) frames,
and against the wrong stored frames (1 and 5 frames later, the same frame of another episode), per store.

    MUJOCO_GL=egl .venv/bin/python tools/replay_psnr.py STORE [STORE ...]

The threshold for a codec must sit below the first column's minimum and above the others' typical values.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from demoforge.pipeline.replay import EnvCache, EpisodeReplay, ReplaySettings, psnr
from demoforge.storage.episode_source import open_episode_source


def measure(store: Path) -> dict[str, list[float]]:
    source = open_episode_source(store)
    envs = EnvCache()
    rendered: dict[int, dict[str, list[np.ndarray]]] = {}
    stored: dict[int, dict[str, list[np.ndarray]]] = {}
    try:
        for ref in source.episodes():
            episode = source.load(ref)
            mine: dict[str, list[np.ndarray]] = {}

            class Capture(EpisodeReplay):
                def _check_images(self, frame, images):
                    for camera, image in images.items():
                        mine.setdefault(camera, []).append(np.asarray(image, dtype=np.uint8).copy())

            settings = ReplaySettings()
            replay = Capture(envs.get(ref.task, episode.task_options or {}), episode,
                             tolerance=settings.tolerance(ref.task), camera_frames=lambda c: [])
            divergence, _, _ = replay.run()
            if divergence is not None:
                print(f"{ref.label} diverged ({divergence.detail}); left out", file=sys.stderr)
                continue
            rendered[ref.number] = mine
            stored[ref.number] = {c: source.camera_frames(episode, c) for c in mine}
    finally:
        envs.close()
        source.close()
    out: dict[str, list[float]] = {"same frame": [], "frame +1": [], "frame +5": [], "other episode": []}
    numbers = sorted(rendered)
    for k, number in enumerate(numbers):
        other = numbers[(k + 1) % len(numbers)] if len(numbers) > 1 else None
        for camera, frames in rendered[number].items():
            video = stored[number][camera]
            for t, image in enumerate(frames):
                out["same frame"].append(psnr(image, video[t]))
                if t + 1 < len(video):
                    out["frame +1"].append(psnr(image, video[t + 1]))
                if t + 5 < len(video):
                    out["frame +5"].append(psnr(image, video[t + 5]))
                if other is not None and other != number and t < len(stored[other][camera]):
                    out["other episode"].append(psnr(image, stored[other][camera][t]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stores", type=Path, nargs="+", help="stores whose committed episodes are replayed and compared")
    args = parser.parse_args()
    print(f"{'store':40} {'codec':10} {'size':9} {'compared':13} {'frames':>6} {'min':>6} {'p1':>6} "
          f"{'median':>6} {'max':>6}  (dB)")
    for store in args.stores:
        source = open_episode_source(store)
        codec = source.schema.video.get("codec")
        size = "x".join(str(v) for v in source.schema.cameras[0][1:]) if source.schema.cameras else "-"
        source.close()
        for name, values in measure(store).items():
            finite = np.array([v if math.isfinite(v) else 99.0 for v in values])
            if not len(finite):
                continue
            print(f"{str(store):40} {codec:10} {size:9} {name:13} {len(finite):6d} {finite.min():6.1f} "
                  f"{np.percentile(finite, 1):6.1f} {np.median(finite):6.1f} {finite.max():6.1f}", flush=True)


if __name__ == "__main__":
    main()
