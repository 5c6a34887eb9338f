"""Rerender frames/s against generate frames/s of the same task and options, in interleaved rounds.

    MUJOCO_GL=egl .venv/bin/python tools/bench_rerender.py --episodes 10 --rounds 2 \
        --task fetch-pick-place --task metaworld-pick-place-v3

Each round generates a fresh store and exports it (``demoforge generate --export``), then rerenders it with the
same options (``demoforge rerender``, which exports the new dataset too). Both are whole commands (start-up and
export included), so the ratio is what a user waits. Rerender never retries and plans nothing new (it walks
the task's plan in step with the recorded actions, so the expert still computes each action); it reads the
source, checks every state and reward, renders and encodes.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FRAMES = re.compile(r"\((\d+) this run, (\d+) frames")
RERENDERED = re.compile(r"into .* \((\d+) frames this run")


def _run(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "demoforge.pipeline.cli", *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", action="append", default=None,
                        help="a task to measure; repeat for more (default fetch-pick-place and metaworld-pick-place-v3)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes generated and rerendered per round (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of generate and rerender (default 2)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a task option for both commands, e.g. image_size=224; repeat for more (default none)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table (default off)")
    args = parser.parse_args()
    rows = []
    for task in args.task or ["fetch-pick-place", "metaworld-pick-place-v3"]:
        options = [x for item in args.option for x in ("--option", item)]
        gen_t, gen_f, rr_t, rr_f = [], [], [], []
        for round_ in range(args.rounds):
            root = Path(tempfile.mkdtemp(prefix="bench-rerender-"))
            try:
                seconds, out = _run(["generate", "--task", task, "--episodes", str(args.episodes), "--seed",
                                     str(round_), "--store", str(root / "s"), "--export", str(root / "g"), *options])
                gen_t.append(seconds)
                gen_f.append(int(re.search(r"committed .*?(\d+) frames", out).group(1)))  # type: ignore[union-attr]
                seconds, out = _run(["rerender", str(root / "s"), "--out", str(root / "d")])
                rr_t.append(seconds)
                rr_f.append(int(RERENDERED.search(out).group(1)))  # type: ignore[union-attr]
            finally:
                shutil.rmtree(root, ignore_errors=True)
        row = {"task": task, "episodes": args.episodes, "rounds": args.rounds,
               "generate_frames_per_s": sum(gen_f) / sum(gen_t), "rerender_frames_per_s": sum(rr_f) / sum(rr_t),
               "generate_s": gen_t, "rerender_s": rr_t, "frames": gen_f}
        row["ratio"] = row["rerender_frames_per_s"] / row["generate_frames_per_s"]
        rows.append(row)
        if not args.json:
            print(f"{task}: generate {row['generate_frames_per_s']:.1f} frames/s, rerender "
                  f"{row['rerender_frames_per_s']:.1f} frames/s: rerender / generate = {row['ratio']:.2f} "
                  f"({args.rounds} rounds of {args.episodes} episodes, {sum(gen_f)} frames)", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
