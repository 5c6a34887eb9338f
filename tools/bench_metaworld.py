#!/usr/bin/env python
"""Meta-World benchmarks: the 50 experts, what recording costs over the simulator, a whole MT50 job, LeRobot's eval.

Run from the repository root (each part on its own, or several)::

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_metaworld.py --experts [--seeds 10]
    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_metaworld.py --overhead [--task metaworld-pick-place-v3]
    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_metaworld.py --mt50
    MUJOCO_GL=egl HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_metaworld.py --eval

--experts   every task's expert, one attempt per seed, no camera: success rate, mean episode length (steps) of
            the successes, segments per successful episode (mean and range), seconds per task.
--overhead  one task at its defaults (480x480, shadows): wall time of ``demoforge generate`` (thread and process
            executors, each with its encoders in a process of their own, the default at this size, and beside
            the env) over ``demoforge run`` (the simulator and expert alone, nothing stored) on the same
            episodes, side by side in interleaved rounds, with CPU utilisation. Target <= 1.05.
--mt50      ``demoforge generate --task metaworld-mt50 --episodes 1 --export``: wall time, frames/s, store and
            dataset size (the defaults, or --option to change them).
--eval      the loop of tests/test_lerobot_training.py at full length: 2 episodes at the defaults, lerobot-train
            (a small ACT, 2 steps), then lerobot-eval's full 500-step episode in LeRobot's Meta-World env.

Numbers of one invocation are compared with each other; the machine may be shared, so the load average is
printed with each part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))

from bench_scale import cli, load, log, median_run  # noqa: E402  (the same timing of a CLI run)
from round_ratio import round_ratio  # noqa: E402


def experts(seeds: int) -> list[dict]:
    from demoforge.stages.executor import run_episodes
    from demoforge.stages.records import AttemptEnded
    from demoforge.pipeline.tasks import metaworld as mw
    from demoforge.pipeline.tasks.registry import get_task

    rows = []
    for env_name in mw.env_names():
        started = time.monotonic()
        env = get_task(mw.PREFIX + env_name).build({"camera": "none"})
        try:
            results = [r.result for r in run_episodes(env, task=mw.PREFIX + env_name, episodes=seeds, max_attempts=1)
                       if isinstance(r, AttemptEnded)]
        finally:
            env.close()
        good = [r for r in results if r.committable]
        segments = [len(r.segments) for r in good]
        rows.append({"task": env_name, "success": len(good) / len(results),
                     "steps": statistics.mean(r.length for r in good) if good else None,
                     "segments": statistics.mean(segments) if segments else None,
                     "segments_range": (min(segments), max(segments)) if segments else None,
                     "failures": sorted({r.terminal_reason.value for r in results if not r.committable}),
                     "seconds": time.monotonic() - started})
        log(f"{env_name}: {len(good)}/{len(results)} succeeded")
    return rows


def print_experts(rows: list[dict], seeds: int) -> None:
    print(f"\n{seeds} seeds per task, one attempt each, no camera (load {load()})\n")
    print("| task | success | mean steps | segments (mean, range) | failures |")
    print("|---|---|---|---|---|")
    for r in rows:
        steps = f"{r['steps']:.0f}" if r["steps"] is not None else "-"
        segs = f"{r['segments']:.1f} ({r['segments_range'][0]}-{r['segments_range'][1]})" if r["segments"] else "-"
        print(f"| {r['task']} | {r['success']:.0%} | {steps} | {segs} | {', '.join(r['failures']) or '-'} |")
    rate = statistics.mean(r["success"] for r in rows)
    perfect = sum(r["success"] == 1 for r in rows)
    print(f"\nall tasks: mean success {rate:.1%}; {perfect}/{len(rows)} tasks succeed on every seed; "
          f"mean segments {statistics.mean(r['segments'] for r in rows if r['segments']):.1f}; "
          f"{sum(r['seconds'] for r in rows):.0f} s")


def overhead(task: str, episodes: int, repeat: int, options: list[str], normal: bool = False) -> None:
    extra = [a for o in options for a in ("--option", o)]
    work = Path(tempfile.mkdtemp(prefix="bench-mw-"))
    placements = [("", []), ("beside the env", ["--encoder-process", "off"])]
    if normal:  # the default runs the encoder process's encoders at idle priority
        placements.append(("at normal priority", ["--encoder-priority", "normal"]))
    variants = {f"generate {kind}{', encoders ' + where if where else ''}": (kind, flag)
                for kind in ("thread", "process") for where, flag in placements}
    runs: dict[str, list[dict]] = {"env only": [], **{name: [] for name in variants}}
    try:
        for round_ in range(repeat):
            log(f"round {round_ + 1}/{repeat}")
            runs["env only"].append(cli("run", "--task", task, "--episodes", str(episodes), "--max-attempts", "1",
                                        *extra))
            for name, (kind, flag) in variants.items():
                store = work / "store"
                shutil.rmtree(store, ignore_errors=True)
                runs[name].append(cli("generate", "--task", task, "--episodes", str(episodes), "--max-attempts", "1",
                                      "--store", str(store), "--executor", kind, *flag, *extra))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    chosen = {name: median_run(r) for name, r in runs.items()}
    base = chosen["env only"]["wall"]
    print(f"\n{task}, {episodes} episode(s), {' '.join(options) or 'defaults'}, median of {repeat} interleaved "
          f"round(s) (load at the end {load()})\n")
    print("| command | wall s (rounds) | / env only | CPU utilisation of 2 cores | frames |")
    print("|---|---|---|---|---|")
    for name, r in chosen.items():
        walls = ", ".join(f"{w:.1f}" for w in r["walls"])
        print(f"| {name} | {r['wall']:.1f} ({walls}) | {r['wall'] / base:.3f} | {r['util']:.0%} | {r['frames']} |")
    print("\nPer-round ratios over the same round's env only (tools/round_ratio.py):")
    env_walls = [r["wall"] for r in runs["env only"]]
    for name in variants:
        print(f"- {name}: {round_ratio([r['wall'] for r in runs[name]], env_walls).describe(1.05)}")


def mt50(options: list[str]) -> None:
    extra = [a for o in options for a in ("--option", o)]
    work = Path(tempfile.mkdtemp(prefix="bench-mt50-"))
    try:
        store, dataset = work / "store", work / "dataset"
        log(f"MT50, 1 episode per task ({' '.join(options) or 'defaults'}); load {load()}")
        run = cli("generate", "--task", "metaworld-mt50", "--episodes", "1", "--max-attempts", "5", "--store",
                  str(store), "--export", str(dataset), *extra)

        def size(path: Path) -> int:
            return sum(p.stat().st_size for p in path.resolve().rglob("*") if p.is_file())

        print(f"\nmetaworld-mt50, 1 episode of each task, {' '.join(options) or 'defaults'} (load {load()})\n")
        print(f"- wall {run['wall']:.0f} s (generate and export), {run['frames']} frames, "
              f"{run['frames'] / run['wall']:.1f} frames/s, CPU utilisation {run['util']:.0%}")
        print(f"- store {size(store) / 2**20:.1f} MiB, dataset {size(dataset) / 2**20:.1f} MiB")
        print("- " + next((line for line in run["stdout"].splitlines() if line.startswith("done:")), "?"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def full_eval(task: str) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    work = Path(tempfile.mkdtemp(prefix="bench-mweval-"))
    bin_dir = Path(sys.executable).parent
    try:
        dataset = work / "dataset"
        steps = [("generate 2 episodes", [sys.executable, "-m", "demoforge.pipeline.cli", "generate", "--task", task,
                                          "--episodes", "2", "--store", str(work / "store"), "--export", str(dataset)]),
                 ("lerobot-train, 2 steps", [str(bin_dir / "lerobot-train"), "--dataset.repo_id=demoforge/bench",
                                             f"--dataset.root={dataset}", "--policy.type=act", "--policy.device=cpu",
                                             "--policy.push_to_hub=false", "--policy.pretrained_backbone_weights=null",
                                             "--steps=2", "--batch_size=2", "--num_workers=0", "--save_freq=2",
                                             "--wandb.enable=false", f"--output_dir={work / 'train'}"]),
                 ("lerobot-eval, one full episode", [
                     str(bin_dir / "lerobot-eval"),
                     f"--policy.path={work / 'train/checkpoints/last/pretrained_model'}", "--env.type=metaworld",
                     f"--env.task={task.removeprefix('metaworld-')}", "--eval.n_episodes=1", "--eval.batch_size=1",
                     "--policy.device=cpu", f"--output_dir={work / 'eval'}"])]
        print(f"\n{task}: generate, train, evaluate in LeRobot's Meta-World env (load {load()})\n")
        for name, argv in steps:
            started = time.monotonic()
            done = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            print(f"- {name}: {time.monotonic() - started:.0f} s, exit 0")
        info = json.loads((work / "eval" / "eval_info.json").read_text())["overall"]
        print(f"- eval: {info['n_episodes']} episode, success {info['pc_success']}%, {info['eval_s']:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", action="store_true", help="success, length and segments of all 50 experts")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per task for --experts (default: 10)")
    parser.add_argument("--overhead", action="store_true", help="generate / env-only wall time on one task")
    parser.add_argument("--task", default="metaworld-pick-place-v3",
                        help="the task of --overhead and --eval (default: metaworld-pick-place-v3)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes of --overhead (default: 3)")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds of --overhead (default: 2)")
    parser.add_argument("--encoder-normal", action="store_true",
                        help="--overhead also runs generate with --encoder-priority normal (default: off)")
    parser.add_argument("--mt50", action="store_true", help="a whole MT50 job, 1 episode per task, with export")
    parser.add_argument("--eval", action="store_true", help="train 2 steps, evaluate one full LeRobot episode")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="task options for --overhead and --mt50 (default: none, the task's defaults)")
    args = parser.parse_args()
    if not (args.experts or args.overhead or args.mt50 or args.eval):
        parser.error("choose at least one of --experts, --overhead, --mt50, --eval")
    if args.experts:
        print_experts(experts(args.seeds), args.seeds)
    if args.overhead:
        overhead(args.task, args.episodes, args.repeat, args.option, normal=args.encoder_normal)
    if args.mt50:
        mt50(args.option)
    if args.eval:
        full_eval(args.task)


if __name__ == "__main__":
    main()
