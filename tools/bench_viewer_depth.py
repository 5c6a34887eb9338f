#!/usr/bin/env python
"""What showing a depth camera in ``demoforge view`` costs: the colour-mapped H.264 preview of one episode,
against remuxing the same episode's RGB camera (what an RGB camera costs the viewer), in the same run.

Run from the repository root::

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_viewer_depth.py [--store STORE] [--cycles 10]

Without ``--store`` it records one fetch-pick-place episode (``--cycles`` pick-and-place cycles, 224x224,
depth=true; 10 cycles are about 400 frames) into a temporary store. Per committed episode and ``--repeat``
rounds it prints the median seconds of: decoding the staged depth codes, colour-mapping and encoding them
(``depth_preview.encode_preview``), the RGB remux, and the preview's size. The one-off lerobot/torch import
(LeRobot's dequantizer) is done before timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from demoforge.pipeline.job import JobSpec  # noqa: E402
from demoforge.pipeline.runner import run_job  # noqa: E402
from demoforge.storage import depth as depth_video  # noqa: E402
from demoforge.storage.store import open_store  # noqa: E402
from demoforge.pipeline.viewer.depth_preview import encode_preview  # noqa: E402
from demoforge.pipeline.viewer.remux import remux_to_mp4  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: tools/bench_viewer_depth.py --cycles 10 --repeat 3")
    parser.add_argument("--store", type=Path, help="a store with a depth camera (default: record one episode)")
    parser.add_argument("--cycles", type=int, default=10, help="cycles of the recorded episode (default: 10)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds per episode (default: 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store
        if store is None:
            store = Path(tmp) / "store"
            print(f"recording 1 fetch-pick-place episode (cycles={args.cycles}, 224x224, depth) ...", flush=True)
            run_job(JobSpec(task="fetch-pick-place", episodes=1,
                            task_options={"cycles": args.cycles, "depth": True}), store)
        depth_video.dequantize(np.zeros(1, np.uint16), depth_video.lerobot_depth_identity())  # the import
        with open_store(store) as view:
            fingerprint, staging = view.require_job()
            depth_cams = [c for c in fingerprint.cameras if c.is_depth]
            rgb_cams = [c for c in fingerprint.cameras if not c.is_depth]
            if not depth_cams or fingerprint.depth_video is None:
                raise SystemExit(f"{store} has no depth camera")
            print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.repeat} round(s)")
            print(f"{'episode':<16}{'frames':>7}{'size':>10}{'decode s':>10}{'encode s':>10}{'preview s':>11}"
                  f"{'rgb remux s':>13}{'ratio':>7}{'preview kB':>12}")
            for row in view.committed():
                staged = staging.read_episode(row.episode_id, row.frames or 0, row.video_bytes)
                cam = depth_cams[0]
                decode, encode, remux, size = [], [], [], 0
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    codes = np.stack(list(depth_video.iter_codes(staged.video[cam.name])))
                    t1 = time.perf_counter()
                    preview = encode_preview(codes, fingerprint.depth_video, fingerprint.fps)
                    t2 = time.perf_counter()
                    if rgb_cams:
                        remux_to_mp4(staged.video[rgb_cams[0].name])
                    t3 = time.perf_counter()
                    decode.append(t1 - t0)
                    encode.append(t2 - t1)
                    remux.append(t3 - t2)
                    size = len(preview.mp4)
                d, e, r = (statistics.median(x) for x in (decode, encode, remux))
                print(f"{row.episode_id:<16}{row.frames:>7}{f'{cam.width}x{cam.height}':>10}{d:>10.2f}{e:>10.2f}"
                      f"{d + e:>11.2f}{r:>13.3f}{(d + e) / max(r, 1e-9):>7.0f}{size / 1000:>12.0f}")


if __name__ == "__main__":
    main()
