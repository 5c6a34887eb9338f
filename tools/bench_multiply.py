#!/usr/bin/env python
"""What does ``demoforge multiply`` buy? Few narrow demonstrations, many generated ones, and a policy trained on each.

Run from the repository root (it runs ``demoforge`` commands as child processes of its own)::

    nice -n 10 .venv/bin/python tools/bench_multiply.py [--tasks fetch-pick-place,metaworld-push-v3] \\
        [--sources 10] [--episodes 200] [--init-range 0.3] [--train-steps 3000] [--eval-episodes 50] \\
        [--out runs/bench-multiply] [--plot docs/images/multiply-bench.png]

For each task:

1. **Sources**: ``demoforge generate`` makes S expert demonstrations in a narrow start range (``--option
   init_range=R``: the task's object start range shrunk about its centre to R of its size; MimicGen's D0).
2. **Multiply**: ``demoforge multiply`` makes N demonstrations from them over the task's full range (``--option
   init_range=1``; MimicGen's D0 -> D1). Reported: the generation success rate (successes / attempts, from the
   store's catalog), and demonstrations per CPU-hour (the child process's user + system time, extraction of
   the source included).
3. **Expert**: ``demoforge generate`` makes N expert demonstrations over the full range: the reference arm, and
   the expert's demonstrations per CPU-hour. ``--strategy`` and ``--interpolation`` are multiply's own.
4. **Behaviour cloning**: tools/bc_policy.py's MLP (same network, steps and seed for every arm) is trained on
   (a) the S sources, (b) the S sources + the N generated, (c) the N expert demonstrations, with the task's state
   as input (Meta-World: its 39-d ``observation.environment_state``; fetch: ``observation.state`` and
   ``observation.goal``, 25 + 3) and the recorded action as label. Each is rolled out on ``--eval-episodes``
   held-out seeds over the full range (``derive_seed(900000, i, 0)``, checked disjoint from every training
   seed): success is the task's own check at any step before the env ends the episode (Meta-World: its
   ``info["success"]``, where its env terminates; fetch: the cube at the goal). 95% Wilson intervals.

``--recorder TASKS`` (Meta-World tasks) adds a row per task whose S sources come from a ``Recorder`` loop instead
of ``generate``: a noisy scripted operator (the task's expert, gaussian 0.1 on every move, as a person at a teleop
would be) in the narrow range, recording the poses multiply needs (``pose_features`` / ``pose_frame``); the
rest is the same. Tasks in :data:`NOTES` (so101-pick-place) are skipped with the reason. Prints a table and
writes ``results.json`` to ``--out`` and, with matplotlib installed, the plot to ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bc_policy  # noqa: E402
from demoforge.pipeline.evaluation import wilson_interval  # noqa: E402
from demoforge.pipeline.multiply import task_poses  # noqa: E402
from demoforge.pipeline.tasks.registry import get_task  # noqa: E402
from demoforge.stages.executor import derive_seed  # noqa: E402
from demoforge.storage.episode_source import open_episode_source  # noqa: E402
from demoforge.storage.schema import READABLE_STATES, AttemptState  # noqa: E402
from demoforge.storage.store import open_store  # noqa: E402

DEFAULT_TASKS = "fetch-pick-place,metaworld-pick-place-v3,metaworld-push-v3,metaworld-drawer-open-v3"
OPTIONS: dict[str, dict[str, Any]] = {
    "fetch-pick-place": {"cycles": 1, "image_size": 64, "antialias": False},
    "metaworld": {"camera": "none", "full_state": True},
}
FEATURES = {"fetch-pick-place": ("observation.state", "observation.goal"),
            "metaworld": ("observation.environment_state",)}
#: Tasks left out on purpose, and why (printed and kept in results.json).
NOTES = {"so101-pick-place": "its recorded state is the arm's 6 joint positions only, no cube pose, so a state-based "
                             "BC policy cannot see the cube (an image policy is another benchmark); it also declares "
                             "no narrow start range (init_range)"}
ARMS = ("sources", "multiplied", "expert")
ARM_TEXT = {"sources": "(a) S sources", "multiplied": "(b) S + N multiplied", "expert": "(c) N expert"}
SOURCE_SEED, MULTIPLY_SEED, EXPERT_SEED, EVAL_SEED = 1, 2, 3, 900_000
RECORDER_SEED = 500_000  # the Recorder loop's env seeds: 500000, 500001, ... (its episodes record seed 0)


def family(task: str) -> str:
    return "metaworld" if task.startswith("metaworld-") else task


def options_of(task: str) -> dict[str, Any]:
    return dict(OPTIONS[family(task)])


def option_args(options: dict[str, Any]) -> list[str]:
    out = []
    for key, value in options.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += ["--option", f"{key}={text}"]
    return out


@dataclass(frozen=True)
class Run:
    """One ``demoforge`` child process: its wall and CPU seconds (user + system, its threads included)."""

    wall_s: float
    cpu_s: float
    stdout: str


def demoforge(*args: str) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "demoforge.pipeline.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"demoforge {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(wall, cpu, done.stdout)


def attempts_of(store: Path) -> tuple[int, int]:
    """(successes, attempts) of a store's job: committed episodes, and those plus every counted discard (an
    attempt a kill interrupted is not counted: it is retried)."""
    with open_store(store) as view:
        rows = view.attempts()
    good = sum(1 for r in rows if r.state in READABLE_STATES and not r.kept_failure)
    failed = sum(1 for r in rows if (r.state == AttemptState.DISCARDED and r.counted) or r.kept_failure)
    return good, good + failed


def frames_of(store: Path, keys: tuple[str, ...]) -> tuple[list[np.ndarray], list[np.ndarray], set[int]]:
    """Each committed episode's states (its features side by side) and action labels, and the seeds used."""
    source = open_episode_source(store)
    try:
        states, labels, seeds = [], [], set()
        for ref in source.episodes():
            episode = source.load(ref)
            states.append(np.concatenate([np.asarray(episode.state[k], dtype=np.float32) for k in keys], axis=1))
            labels.append(np.asarray(episode.action, dtype=np.float32))
            seeds.add(int(ref.seed))
        return states, labels, seeds
    finally:
        source.close()


def evaluate(task: str, options: dict[str, Any], keys: tuple[str, ...], weights: Path,
             seeds: list[int]) -> dict[str, Any]:
    """Roll the policy out from each seed until the task reports success or the env ends the episode."""
    env = get_task(task).build(options)
    policy = bc_policy.BCPolicy(weights)
    record, success = env.get_wrapper_attr("demo_record"), env.get_wrapper_attr("demo_success")
    wins, lengths = 0, []
    try:
        for seed in seeds:
            observation, info = env.reset(seed=seed)
            for step in range(1, 2001):
                state = record(observation).state
                x = np.concatenate([np.asarray(state[k], dtype=np.float32) for k in keys])
                action = policy.select_action({bc_policy.INPUT: x})
                observation, _, terminated, truncated, info = env.step(action)
                if success(observation, info):
                    wins += 1
                    lengths.append(step)
                    break
                if terminated or truncated:
                    break
    finally:
        env.close()
    low, high = wilson_interval(wins, len(seeds))
    return {"success": wins, "episodes": len(seeds), "rate": wins / len(seeds), "ci95": [low, high],
            "mean_success_length": round(float(np.mean(lengths)), 1) if lengths else None}


def can_multiply(task: str, options: dict[str, Any]) -> str | None:
    """None, or why the task cannot be in the benchmark (no TracksPoses, no narrow start range)."""
    try:
        get_task(task).resolve_options({**options, "init_range": 0.5})
        env = get_task(task).build(options)
    except Exception as exc:  # an option it lacks (init_range), a simulator it lacks
        return f"{type(exc).__name__}: {exc}"
    try:
        env.reset(seed=0)
        if task_poses(env) is None:
            return "it does not report poses (no TracksPoses capability yet)"
    finally:
        env.close()
    return None


def per_hour(episodes: int, seconds: float) -> float:
    return episodes / seconds * 3600 if seconds > 0 else float("nan")


def record_sources(task: str, options: dict[str, Any], episodes: int, init_range: float, root: Path) -> Path:
    """``episodes`` demonstrations from a Recorder loop over the task's env in the narrow range, driven by a
    noisy scripted operator (Meta-World's expert + gaussian 0.1 on the moves; failed takes are discarded, as a
    person would redo them). Returns the dataset's root (the multiply source)."""
    from demoforge import Recorder
    from demoforge.pipeline.multiply import pose_features, pose_frame

    env = get_task(task).build({**options, "init_range": init_range})
    shaky = np.random.default_rng(0)
    key = FEATURES["metaworld"][0]
    try:
        observation, _ = env.reset(seed=RECORDER_SEED)
        features: dict[str, dict[str, Any]] = {key: {"dtype": "float32", "shape": (39,), "names": None},
                    "action": {"dtype": "float32", "shape": (4,), "names": ["dx", "dy", "dz", "gripper"]},
                    **pose_features(env)}
        expert = env.get_wrapper_attr("expert")
        take = 0
        with Recorder.create(root, fps=80, features=features, codec="h264") as recorder:
            while recorder.episode_index < episodes:
                observation, _ = env.reset(seed=RECORDER_SEED + take)
                take += 1
                terminated = False
                for _ in range(500):
                    action, phase = expert.decide(observation)
                    action = np.clip(action + np.append(shaky.normal(0.0, 0.1, 3), 0.0), -1, 1).astype(np.float32)
                    recorder.add_frame({key: np.asarray(observation, dtype=np.float32), "action": action,
                                        "task": get_task(task).info(options).instruction,
                                        **pose_frame(env, action)}, segment=phase.name, target=phase.target)
                    observation, _, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        break
                if terminated:
                    recorder.save_episode()
                else:
                    recorder.discard_episode()
    finally:
        env.close()
    return root


def bench_task(task: str, args: argparse.Namespace, work: Path, recorder: bool = False) -> dict[str, Any]:
    options, keys = options_of(task), FEATURES[family(task)]
    common = ["--task", task, *option_args(options), "--codec", "h264"]
    sources, multiplied, expert = work / "sources", work / "multiplied", work / "expert"
    started = time.monotonic()
    named = []  # a Recorder-made source names the task it was recorded in
    if recorder:
        record_sources(task, options, args.sources, args.init_range, sources)
        named = common[:-2]
    else:
        demoforge("generate", *common, "--option", f"init_range={args.init_range}", "--episodes", str(args.sources),
                  "--seed", str(SOURCE_SEED), "--store", str(sources))
    made = demoforge("multiply", str(sources), *named, "--option", "init_range=1", "--episodes", str(args.episodes),
                     "--seed", str(MULTIPLY_SEED), "--strategy", args.strategy,
                     "--max-attempts", str(args.max_attempts), "--interpolation", str(args.interpolation),
                     "--store", str(multiplied))
    good, attempts = attempts_of(multiplied)
    reference = demoforge("generate", *common, "--episodes", str(args.episodes), "--seed", str(EXPERT_SEED),
                          "--store", str(expert))
    expert_good, expert_attempts = attempts_of(expert)
    data = {name: frames_of(store, keys) for name, store in (("sources", sources), ("multiplied", multiplied),
                                                             ("expert", expert))}
    arms = {"sources": data["sources"],
            "multiplied": (data["sources"][0] + data["multiplied"][0], data["sources"][1] + data["multiplied"][1],
                           data["sources"][2] | data["multiplied"][2]),
            "expert": data["expert"]}
    eval_seeds = [derive_seed(EVAL_SEED, i, 0) for i in range(args.eval_episodes)]
    result: dict[str, Any] = {
        "task": task, "source": "recorder" if recorder else "generate", "sources": args.sources,
        "interpolation": args.interpolation, "strategy": args.strategy,
        "episodes": args.episodes, "init_range": args.init_range,
        "generation": {"successes": good, "attempts": attempts, "rate": good / attempts if attempts else None,
                       "wall_s": round(made.wall_s, 1), "cpu_s": round(made.cpu_s, 1),
                       "per_cpu_hour": round(per_hour(good, made.cpu_s))},
        "expert": {"successes": expert_good, "attempts": expert_attempts, "wall_s": round(reference.wall_s, 1),
                   "cpu_s": round(reference.cpu_s, 1), "per_cpu_hour": round(per_hour(expert_good, reference.cpu_s))},
        "arms": {}}
    print(f"  {task}: generation {good}/{attempts} attempts; multiply {per_hour(good, made.cpu_s):.0f} demos per "
          f"CPU-hour, expert {per_hour(expert_good, reference.cpu_s):.0f}", flush=True)
    full = {**options, "init_range": 1.0}
    if recorder:
        arms["sources"][2].update(range(RECORDER_SEED, RECORDER_SEED + 10 * args.sources))
        arms["multiplied"][2].update(arms["sources"][2])
    for name in ARMS:
        states, labels, seeds = arms[name]
        assert not seeds & set(eval_seeds), f"{task} {name}: a training seed is an evaluation seed"
        weights = work / f"{name}.safetensors"
        trained = time.monotonic()
        loss = bc_policy.train(np.concatenate(states), np.concatenate(labels), weights, steps=args.train_steps)
        outcome = evaluate(task, full, keys, weights, eval_seeds)
        result["arms"][name] = {**outcome, "demonstrations": len(states), "frames": int(sum(len(s) for s in states)),
                                "final_loss": round(loss, 5), "seconds": round(time.monotonic() - trained, 1)}
        print(f"  {task}{' (recorder)' if recorder else ''} {ARM_TEXT[name]:22s} "
              f"{outcome['success']:3d}/{outcome['episodes']} ({outcome['rate']:.0%}, "
              f"CI {outcome['ci95'][0]:.0%}-{outcome['ci95'][1]:.0%}) from {len(states)} demos", flush=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    """Grouped bars: policy success per task and arm (95% interval), and the generation success rate."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colours = {"sources": "#7f7f7f", "multiplied": "#1f77b4", "expert": "#2ca02c"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11.0, 1.5 * len(results) + 5), 4.4),
                                      gridspec_kw={"width_ratios": [3, 1.2]})
    x = np.arange(len(results))
    width = 0.26
    for i, arm in enumerate(ARMS):
        rates = np.array([r["arms"][arm]["rate"] for r in results]) * 100
        lows = np.maximum(0, rates - np.array([r["arms"][arm]["ci95"][0] for r in results]) * 100)
        highs = np.maximum(0, np.array([r["arms"][arm]["ci95"][1] for r in results]) * 100 - rates)
        left.bar(x + (i - 1) * width, rates, width, yerr=[lows, highs], capsize=3, color=colours[arm],
                 label=ARM_TEXT[arm])
    names = [label(r).removeprefix("metaworld-").replace("-v3", "") for r in results]
    left.set_xticks(x, names, rotation=20 if len(results) > 4 else 0, ha="right" if len(results) > 4 else "center")
    left.set_ylim(0, 105)
    left.set_ylabel("BC policy success, full range (%)")
    left.set_title(f"BC on S={results[0]['sources']} narrow sources vs S+N, N={results[0]['episodes']}", fontsize=10)
    left.legend(fontsize=8, loc="upper left")
    generated = [100 * (r["generation"]["rate"] or 0) for r in results]
    right.bar(x, generated, 0.6, color="#1f77b4")
    right.set_xticks(x, names, rotation=30, ha="right")
    right.set_ylim(0, 105)
    right.set_title("multiply: generation success (%)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def label(result: dict[str, Any]) -> str:
    return (result["task"] + (" (recorder)" if result.get("source") == "recorder" else "")
            + (f" K={result['interpolation']}" if result.get("interpolation", 5) != 5 else ""))


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'task':26s} {'gen. success':>14s} {'multiply/h':>10s} {'expert/h':>9s} "
             + " ".join(f"{ARM_TEXT[a]:>22s}" for a in ARMS) + "  (b)-(a)  (c)-(b)"]
    for r in results:
        g, arms = r["generation"], r["arms"]
        cells = [f"{arms[a]['rate']:4.0%} ({arms[a]['ci95'][0]:.0%}-{arms[a]['ci95'][1]:.0%})" for a in ARMS]
        gain = (arms["multiplied"]["rate"] - arms["sources"]["rate"]) * 100
        gap = (arms["expert"]["rate"] - arms["multiplied"]["rate"]) * 100
        lines.append(f"{label(r):26s} {g['successes']:>5d}/{g['attempts']:<4d}{g['rate']:4.0%} "
                     f"{g['per_cpu_hour']:>10d} {r['expert']['per_cpu_hour']:>9d} "
                     + " ".join(f"{c:>22s}" for c in cells) + f"  {gain:+6.0f}  {gap:+6.0f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help=f"tasks (default: {DEFAULT_TASKS})")
    parser.add_argument("--sources", type=int, default=10, help="source demonstrations S (default: 10)")
    parser.add_argument("--recorder", default="", help="Meta-World tasks whose sources also come from a Recorder loop "
                                                       "(a row each; default: none)")
    parser.add_argument("--episodes", type=int, default=200,
                        help="generated and expert demonstrations N (default: 200)")
    parser.add_argument("--init-range", type=float, default=0.3,
                        help="the sources' start range, a share of the task's own (default: 0.3)")
    parser.add_argument("--strategy", choices=("random", "nearest"), default="nearest",
                        help="multiply --strategy (default: nearest)")
    parser.add_argument("--max-attempts", type=int, default=10, help="multiply --max-attempts (default: 10)")
    parser.add_argument("--interpolation", type=int, default=5,
                        help="multiply --interpolation K (default: 5, multiply's own; 0: only the steps the distance "
                             "needs, no pause where the arm is already there)")
    parser.add_argument("--train-steps", type=int, default=3000, help="MLP training steps, every arm (default: 3000)")
    parser.add_argument("--eval-episodes", type=int, default=50, help="held-out evaluation seeds (default: 50)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-multiply"),
                        help="where results.json goes (default: runs/bench-multiply)")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot (PNG) here")
    parser.add_argument("--from-results", type=Path, nargs="+", default=None, metavar="RESULTS_JSON",
                        help="run nothing: print the table (and --plot) of earlier runs' results.json, in order")
    args = parser.parse_args()
    if args.from_results:
        results = [r for path in args.from_results for r in json.loads(path.read_text())["results"]]
        print(table(results))
        if args.plot is not None:
            print(f"plot: {args.plot}" if plot(results, args.plot) else "matplotlib is not installed: no plot")
        return 0
    if args.sources < 2 or args.episodes < 1 or args.eval_episodes < 1 or not 0.1 <= args.init_range <= 1:
        parser.error("--sources >= 2, --episodes >= 1, --eval-episodes >= 1, --init-range in 0.1..1")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}; tasks {args.tasks}; S={args.sources} (init_range "
          f"{args.init_range}), N={args.episodes}, strategy {args.strategy}, interpolation {args.interpolation}; "
          f"{args.train_steps} training steps; "
          f"{args.eval_episodes} evaluation seeds", flush=True)
    results, skipped = [], {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-multiply-") as scratch:
        for task in filter(None, args.tasks.split(",")):
            why = NOTES.get(task) or (can_multiply(task, options_of(task)) if family(task) in OPTIONS
                                      else "no benchmark options for it")
            if why is not None:
                skipped[task] = why
                print(f"  {task}: skipped ({why})", flush=True)
                continue
            results.append(bench_task(task, args, Path(scratch) / task))
            (args.out / "results.json").write_text(json.dumps({"results": results, "skipped": skipped}, indent=2))
        for task in filter(None, args.recorder.split(",")):
            if family(task) != "metaworld":
                skipped[f"{task} (recorder)"] = "the Recorder loop's operator is Meta-World's expert"
                continue
            results.append(bench_task(task, args, Path(scratch) / f"{task}-recorder", recorder=True))
            (args.out / "results.json").write_text(json.dumps({"results": results, "skipped": skipped}, indent=2))
    (args.out / "results.json").write_text(json.dumps({"results": results, "skipped": skipped}, indent=2))
    print()
    print(table(results))
    for task, why in skipped.items():
        print(f"skipped {task}: {why}")
    wins = sum(1 for r in results if r["arms"]["multiplied"]["rate"] - r["arms"]["sources"]["rate"] >= 0.25)
    close = sum(1 for r in results if r["arms"]["expert"]["rate"] - r["arms"]["multiplied"]["rate"] <= 0.10)
    print(f"\n(b) beats (a) by >= 25 points on {wins} of {len(results)} tasks; (b) within 10 points of (c) on {close}; "
          f"{time.monotonic() - started:.0f} s; results in {args.out}")
    if args.plot is not None and results:
        print(f"plot: {args.plot}" if plot(results, args.plot) else "matplotlib is not installed: no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
