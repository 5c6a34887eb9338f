"""Success rate, steps per episode and steps/s of the built-in scripted experts over many seeds.

    MUJOCO_GL=egl .venv/bin/python tools/bench_tasks.py --seeds 50 [--task fetch-pick-place] [--option k=v]
    MUJOCO_GL=egl .venv/bin/python tools/bench_tasks.py --seeds 50 --per-axis   # randomization, axis by axis

Every episode index is run once (max_attempts=1), so the success rate is the expert's, not the retry policy's.
Steps/s include rendering the task's cameras at their configured size. ``--per-axis`` runs each task without
randomization, with each axis it supports alone, and with all of them (default ranges or --option's), on the
same seeds, interleaved by nothing else: the steps/s column compares the cost of each axis.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("MUJOCO_GL", "egl")

from demoforge.pipeline.tasks.registry import get_task  # noqa: E402
from demoforge.stages.executor import run_episodes  # noqa: E402
from demoforge.stages.records import AttemptEnded, Frame  # noqa: E402


def bench(task: str, seeds: int, options: dict) -> dict:
    entry = get_task(task)
    env = entry.build(options)
    results, steps = [], 0
    started = time.perf_counter()
    try:
        for record in run_episodes(env, task=task, episodes=seeds, max_attempts=1):
            if isinstance(record, Frame):
                steps += 1
            elif isinstance(record, AttemptEnded):
                results.append(record.result)
    finally:
        env.close()
    elapsed = time.perf_counter() - started
    ok = [r for r in results if r.committable]
    failures: dict[str, int] = {}
    for r in results:
        if not r.committable:
            reason = r.failure_reason or r.terminal_reason.value
            failures[reason] = failures.get(reason, 0) + 1
    lengths = [r.length for r in results]
    resolved = entry.resolve_options(options)
    shown = {k: v for k, v in resolved.items() if entry.all_defaults.get(k) != v}
    return {"task": task, "options": shown, "episodes": len(results),
            "succeeded": len(ok), "success_rate": len(ok) / len(results) if results else 0.0,
            "steps_per_episode_mean": statistics.mean(lengths) if lengths else 0,
            "steps_per_episode_min": min(lengths, default=0), "steps_per_episode_max": max(lengths, default=0),
            "steps_per_s": steps / elapsed if elapsed else 0.0, "elapsed_s": elapsed, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50, help="episode indices (seeds) run per task (default 50)")
    parser.add_argument("--task", action="append", default=None,
                        help="a task to measure; repeat for more (default fetch-pick-place and aloha-transfer-cube)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="applied to every task that has the option")
    parser.add_argument("--per-axis", action="store_true",
                        help="each task without randomization, with each axis it supports, and with all of them")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table (default off)")
    args = parser.parse_args()
    tasks = args.task or ["fetch-pick-place", "aloha-transfer-cube"]
    rows = []
    if not args.json:
        print(f"{'task':<22}{'options':<42}{'success':>12}{'steps/ep (min-max)':>22}{'steps/s':>10}", flush=True)
    for task in tasks:
        entry = get_task(task)
        defaults = entry.all_defaults
        options = {}
        for item in args.option:
            key, _, value = item.partition("=")
            if key in defaults:
                options[key] = json.loads(value) if not isinstance(defaults[key], str) else value
        variants = [options]
        if args.per_axis and entry.randomization is not None:
            axes = entry.randomization.axes()
            variants = [options] + [{**options, "randomize": axis} for axis in axes] + \
                [{**options, "randomize": ",".join(axes)}]
        for variant in variants:
            rows.append(bench(task, args.seeds, variant))
            if not args.json:
                print_row(rows[-1])
    if args.json:
        print(json.dumps(rows, indent=2))


def print_row(r: dict) -> None:
    opts = ",".join(f"{k}={v}" for k, v in r["options"].items())
    print(f"{r['task']:<22}{opts or 'defaults':<42}{r['succeeded']:>5}/{r['episodes']:<3} {r['success_rate']:>4.0%}"
          f"{r['steps_per_episode_mean']:>10.1f} ({r['steps_per_episode_min']}-{r['steps_per_episode_max']})"
          f"{r['steps_per_s']:>10.1f}", flush=True)
    if r["failures"]:
        print(f"  failures: {r['failures']}", flush=True)


if __name__ == "__main__":
    main()
