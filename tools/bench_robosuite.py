#!/usr/bin/env python
"""robosuite tasks: each expert's success rate over many seeds, and how fast episodes run with and without cameras.

Run from the repository root::

    MUJOCO_GL=egl .venv/bin/python tools/bench_robosuite.py [--seeds 100] [--camera-seeds 3] [--task robosuite-can]

For each task in TASKS (or each --task): ``--seeds`` episodes (seeds of job seed 0, one attempt each, no camera)
through demoforge's executor, so an attempt counts only if every segment's validator accepted it and robosuite's
own success held; then ``--camera-seeds`` episodes with the task's default cameras (agentview and
robot0_eye_in_hand, 84x84). Steps/s is recorded steps over the wall time of the stepping alone; a reset with a
seed reloads robosuite's model (its cost is the "reset s" column, per episode). Numbers of one invocation are
compared with each other; the machine may be shared, so the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

TASKS = ("robosuite-lift", "robosuite-can", "robosuite-square", "robosuite-stack")


@dataclass(frozen=True)
class Run:
    """One task's episodes under one set of options."""

    episodes: int
    succeeded: int
    steps: int  # recorded steps, all attempts
    stepping_s: float  # wall time less the resets'
    reset_s: float  # wall time of the resets (model reloads)
    failures: Counter[str]

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.stepping_s if self.stepping_s > 0 else float("nan")


def run(task: str, episodes: int, options: dict[str, Any]) -> Run:
    from demoforge.pipeline.tasks.registry import get_task
    from demoforge.stages.executor import run_episodes
    from demoforge.stages.records import AttemptEnded

    env: Any = get_task(task).build(options)
    resets = [0.0]
    reset = env.reset

    def timed_reset(*args: Any, **kwargs: Any) -> Any:  # the reload a seeded reset does, timed apart
        started = time.perf_counter()
        try:
            return reset(*args, **kwargs)
        finally:
            resets[0] += time.perf_counter() - started

    env.reset = timed_reset
    started = time.perf_counter()
    try:
        ends = [r for r in run_episodes(env, task=task, episodes=episodes, job_seed=0, max_attempts=1)
                if isinstance(r, AttemptEnded)]
    finally:
        env.close()
    wall = time.perf_counter() - started
    return Run(episodes=len(ends), succeeded=sum(e.result.committable for e in ends),
               steps=sum(e.frames for e in ends), stepping_s=wall - resets[0], reset_s=resets[0],
               failures=Counter(str(e.result.failure_reason) for e in ends if not e.result.committable))


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="episodes per task without cameras")
    parser.add_argument("--camera-seeds", type=int, default=3, help="episodes per task with both cameras")
    parser.add_argument("--task", action="append", choices=TASKS, help="only these tasks (repeatable)")
    args = parser.parse_args()
    rows = []
    for task in args.task or TASKS:
        plain = run(task, args.seeds, {"camera": "none"})
        print(f"{task}: {plain.succeeded}/{plain.episodes} without cameras, {plain.steps_per_s:.0f} steps/s "
              f"(load {load()})", flush=True)
        cameras = run(task, args.camera_seeds, {}) if args.camera_seeds > 0 else None
        rows.append((task, plain, cameras))
    print(f"\n{args.seeds} seeds per task without cameras, {args.camera_seeds} with agentview and "
          f"robot0_eye_in_hand at 84x84; one attempt per seed (load at the end {load()})\n")
    print("| task | success | mean steps | steps/s, no camera | reset s | steps/s, 2 cameras | success, cameras "
          "| failures |")
    print("|---|---|---|---|---|---|---|---|")
    for task, plain, cameras in rows:
        seen = f"{cameras.steps_per_s:.0f}" if cameras else "-"
        camera_ok = f"{cameras.succeeded}/{cameras.episodes}" if cameras else "-"
        failures = "; ".join(f"{n}x {why}" for why, n in plain.failures.most_common()) or "-"
        print(f"| {task} | {plain.succeeded / plain.episodes:.0%} | {plain.steps / plain.episodes:.0f} | "
              f"{plain.steps_per_s:.0f} | {plain.reset_s / plain.episodes:.2f} | {seen} | {camera_ok} | {failures} |")
    print(f"\nall: {statistics.mean(p.succeeded / p.episodes for _, p, _ in rows):.1%} mean success")


if __name__ == "__main__":
    main()
