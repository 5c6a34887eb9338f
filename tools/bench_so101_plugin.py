#!/usr/bin/env python
"""so101-plugin-pick-cube: the expert's success rate over many seeds in lerobot-env-so101's own env, and its speed.

Run from the repository root::

    MUJOCO_GL=egl .venv/bin/python tools/bench_so101_plugin.py [--seeds 100] [--fixed-block] [--image-obs]

``--seeds`` episodes (episodes 0.. of job seed 0, one attempt each) through demoforge's executor: an episode
counts only if every segment's validator accepted it and the env's own success (``info["succeed"]``: the block
10 cm up and within 5 cm of the gripper) ended it within the plugin's 100 steps. The plugin's README says its
own scripted controller cannot complete a pick; this measures what our expert gets through the same 4-d action.
Success is also split by the block's distance from the robot's base (x), as the wrist reaches its limit beyond
about 0.3 m and the jaws no longer come down vertically. ``--fixed-block`` runs the plugin config's default
scene (the block at x = 0.3, y = 0 every episode; the physics is deterministic, so every episode is the same).
Steps/s is recorded steps over the stepping wall time (resets excluded); the machine may be shared, so the load
average is printed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

TASK = "so101-plugin-pick-cube"
BANDS = ((0.2, 0.25), (0.25, 0.3), (0.3, 0.35), (0.35, 0.4))  # the plugin samples x in 0.2..0.4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--fixed-block", action="store_true", help="the plugin's default: the block at (0.3, 0)")
    parser.add_argument("--image-obs", action="store_true", help="record the front camera (128x128) as well")
    args = parser.parse_args()

    from demoforge.pipeline.tasks.registry import get_task
    from demoforge.stages.executor import run_episodes
    from demoforge.stages.records import AttemptEnded, AttemptStarted

    options = {"random_block_position": not args.fixed_block, "image_obs": args.image_obs}
    env: Any = get_task(TASK).build(options)
    scene = env.get_wrapper_attr("scene")
    resets = [0.0]
    blocks: dict[int, float] = {}
    reset = env.reset

    def timed_reset(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return reset(*a, **kw)
        finally:
            resets[0] += time.perf_counter() - started

    env.reset = timed_reset
    ended: list[AttemptEnded] = []
    segments: Counter[str] = Counter()
    rejected: Counter[str] = Counter()  # the segment whose validator ended a failed attempt
    started = time.perf_counter()
    try:
        for record in run_episodes(env, task=TASK, episodes=args.seeds, job_seed=0, max_attempts=1):
            if isinstance(record, AttemptStarted):
                blocks[record.key.episode_index] = float(scene.read().block[0])
            if isinstance(record, AttemptEnded):
                ended.append(record)
                segments.update(s.name for s in record.result.segments)
                rejected.update(s.name for s in record.result.segments if not s.success)
    finally:
        env.close()
    wall = time.perf_counter() - started
    steps = sum(e.frames for e in ended)
    succeeded = [e for e in ended if e.result.committable]
    reasons = Counter(str(e.result.terminal_reason) for e in ended if not e.result.committable)
    print(f"{TASK}: {len(succeeded)}/{len(ended)} episodes succeeded ({len(succeeded) / max(1, len(ended)):.0%}), "
          f"options {options}")
    print(f"  steps {steps}, {steps / max(wall - resets[0], 1e-9):.0f} steps/s (resets {resets[0]:.1f} s of "
          f"{wall:.1f} s), mean length of a success "
          f"{sum(e.frames for e in succeeded) / max(1, len(succeeded)):.0f} steps")
    print(f"  failures: {dict(reasons)}; rejected segments: {dict(rejected)}; segments seen: {dict(segments)}")
    if not args.fixed_block:
        for low, high in BANDS:
            band = [e for e in ended if low <= blocks[e.result.episode_index] < high]
            won = sum(e.result.committable for e in band)
            print(f"  block x in [{low:.2f}, {high:.2f}) m: {won}/{len(band)}")
    print(f"  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
