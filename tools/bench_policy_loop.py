#!/usr/bin/env python
"""Does policy-in-the-loop data train better policies? Four arms at equal label budgets, on Meta-World.

Run from the repository root::

    HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_policy_loop.py [--tasks push-v3,drawer-open-v3] \\
        [--budgets 10,25,50] [--eval-episodes 50] [--train-steps 3000] [--out runs/bench-policy-loop]

For each task and label budget B (in episodes' worth of expert labels: the frames of B expert demonstrations,
F), four datasets of exactly F labelled frames are made with ``demoforge`` jobs (camera-less, full state):

(a) expert    B expert demonstrations (``--noise gaussian:0``: the expert drives);
(b) noise     expert + gaussian noise (``--noise gaussian:SIGMA``), labels the clean expert actions (DART);
(c) dagger    half the budget as expert demonstrations, then rounds: train, let the policy drive with the
              expert's action mixed in (``--driver --beta``), the expert labels every visited state, aggregate;
(d) takeover  the same rounds, the policy driving alone until the expert takes over (``--takeover``).

The last collected episode is cut so every arm has exactly F frames. Each arm trains the same MLP
(tools/bc_policy.py: 39-d state -> 4-d action, same size, same steps, same seed) and is evaluated with
``demoforge eval``-s own evaluator on ``--eval-episodes`` seeded episodes whose seeds are disjoint from every
training seed (checked). Prints a table (success %, 95% Wilson interval) and writes ``results.json`` and
``results.svg`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import anyio  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import bc_policy  # noqa: E402
from demoforge.pipeline.evaluation import evaluate  # noqa: E402
from demoforge.pipeline.job import JobSpec  # noqa: E402
from demoforge.pipeline.runner import JobRunner  # noqa: E402
from demoforge.stages.control import ControlSpec, NoiseSpec, TakeoverRule  # noqa: E402
from demoforge.stages.executor import derive_seed  # noqa: E402
from demoforge.stages.settings import VideoSettings  # noqa: E402
from demoforge.storage.episode_source import open_episode_source  # noqa: E402

DEFAULT_TASKS = "pick-place-v3,push-v3,drawer-open-v3,peg-insert-side-v3,button-press-topdown-v3"
OPTIONS = {"camera": "none", "full_state": True}
ARMS = ("expert", "noise", "dagger", "takeover")
EVAL_SEED = 900_000  # the evaluation job's seed; training jobs use seeds below 1000
DRIVER = "bc_policy:load"


def run_job(task: str, store: Path, episodes: int, seed: int, control: ControlSpec) -> None:
    spec = JobSpec(task=f"metaworld-{task}", episodes=episodes, task_options=OPTIONS, seed=seed, max_attempts=3,
                   video=VideoSettings(codec="h264"), control=control, max_consecutive_abandoned=0)
    anyio.run(JobRunner(spec, store).run)


def frames_of(store: Path) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(states, labels, seed) of every committed episode, in episode order."""
    source = open_episode_source(store)
    try:
        out = []
        for ref in source.episodes():
            ep = source.load(ref)
            out.append((np.asarray(ep.state[bc_policy.INPUT]), np.asarray(ep.action), ref.seed))
        return out
    finally:
        source.close()


class Collection:
    """Labelled frames gathered up to a budget (the last episode cut to fit) and the env seeds they came from."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.states: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.seeds: set[int] = set()

    @property
    def frames(self) -> int:
        return sum(len(s) for s in self.states)

    def add(self, episodes: list[tuple[np.ndarray, np.ndarray, int]]) -> None:
        for states, labels, seed in episodes:
            room = self.budget - self.frames
            if room <= 0:
                return
            self.states.append(states[:room])
            self.labels.append(labels[:room])
            self.seeds.add(seed)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.states), np.concatenate(self.labels)


def collect(task: str, work: Path, seed: int, control: ControlSpec, into: Collection, step: int = 2) -> None:
    """Grow one job's store ``step`` episodes at a time (a re-run resumes it) until ``into`` is full."""
    store, episodes, taken = work / f"{seed}", 0, 0
    while into.frames < into.budget:
        episodes += step
        run_job(task, store, episodes, seed, control)
        new = frames_of(store)[taken:]
        taken += len(new)
        into.add(new)


def train(collection: Collection, path: Path, steps: int) -> None:
    states, labels = collection.arrays()
    bc_policy.train(states, labels, path, steps=steps)


def rounds_arm(task: str, work: Path, budget: int, expert_half: Collection, takeover: bool, steps: int,
               rounds: int, beta: float, rule: TakeoverRule) -> Collection:
    """DAgger (beta mixture) or takeover rounds on top of the expert half, up to the budget."""
    work.mkdir(parents=True, exist_ok=True)
    data = Collection(budget)
    data.add([(s, a, -1) for s, a in zip(expert_half.states, expert_half.labels)])
    data.seeds |= expert_half.seeds
    share = math.ceil((budget - data.frames) / rounds)
    for r in range(1, rounds + 1):
        policy = work / f"policy{r}.safetensors"
        train(data, policy, steps)
        os.environ["DEMOFORGE_BC_POLICY"] = str(policy)
        control = ControlSpec(driver=DRIVER, beta=0.0 if takeover else beta, takeover=rule if takeover else None)
        this_round = Collection(min(budget, data.frames + share) - data.frames)
        collect(task, work / f"round{r}", 100 * r, control, this_round, step=1)
        data.add(list(zip(this_round.states, this_round.labels, [-1] * len(this_round.states))))
        data.seeds |= this_round.seeds
    data.seeds.discard(-1)
    return data


def evaluate_policy(task: str, path: Path, episodes: int) -> dict:
    os.environ["DEMOFORGE_BC_POLICY"] = str(path)
    report = evaluate(f"metaworld-{task}", DRIVER, episodes, seed=EVAL_SEED, task_options=OPTIONS)
    low, high = report.interval
    return {"success": report.successes, "episodes": len(report.episodes), "rate": report.success_rate,
            "ci95": [low, high], "seeds": [e.seed for e in report.episodes], "mean_length": report.mean_length}


def bench_task(task: str, budget_episodes: int, args: argparse.Namespace, root: Path) -> dict:
    work = root / task / f"b{budget_episodes}"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # (a) the expert's demonstrations define the budget F: their frames.
    expert = Collection(10**9)
    run_job(task, work / "expert", budget_episodes, 1, ControlSpec(noise=NoiseSpec((0.0,))))
    expert.add(frames_of(work / "expert"))
    budget = expert.frames
    expert.budget = budget
    half = Collection(budget)
    half.add(frames_of(work / "expert")[:max(1, budget_episodes // 2)])
    arms: dict[str, Collection] = {"expert": expert}
    noise = Collection(budget)
    collect(task, work / "noise", 2, ControlSpec(noise=NoiseSpec((args.sigma,))), noise)
    arms["noise"] = noise
    rule = TakeoverRule(args.gap, args.gap_steps)
    arms["dagger"] = rounds_arm(task, work / "dagger", budget, half, False, args.train_steps, args.rounds, args.beta,
                                rule)
    arms["takeover"] = rounds_arm(task, work / "takeover", budget, half, True, args.train_steps, args.rounds,
                                  args.beta, rule)
    result: dict = {"task": task, "budget_episodes": budget_episodes, "budget_frames": budget, "arms": {}}
    eval_seeds = {derive_seed(EVAL_SEED, i, 0) for i in range(args.eval_episodes)}
    for name in ARMS:
        data = arms[name]
        assert data.frames == budget, (name, data.frames, budget)
        assert not (data.seeds & eval_seeds), f"{name}: a training seed is an evaluation seed"
        policy = work / f"{name}.safetensors"
        train(data, policy, args.train_steps)
        outcome = evaluate_policy(task, policy, args.eval_episodes)
        assert not (set(outcome.pop("seeds")) & data.seeds)
        result["arms"][name] = {**outcome, "frames": data.frames, "episodes_labelled": len(data.states)}
        print(f"  {task} B={budget_episodes} {name:9s} {outcome['success']:3d}/{outcome['episodes']} "
              f"({outcome['rate']:.0%}, CI {outcome['ci95'][0]:.0%}-{outcome['ci95'][1]:.0%})", flush=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def svg(results: list[dict]) -> str:
    """Grouped bars: success % per task (and budget), one bar per arm, with its 95% interval."""
    colours = {"expert": "#7f7f7f", "noise": "#1f77b4", "dagger": "#2ca02c", "takeover": "#d62728"}
    group_w, bar_w, height, top, left = 4 * 18 + 24, 18, 220, 30, 40
    width = left + group_w * len(results) + 120
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 90}" font-family="sans-serif" '
           'font-size="11">']
    for pct in (0, 50, 100):
        y = top + height - pct / 100 * height
        out.append(f'<line x1="{left}" x2="{width - 120}" y1="{y}" y2="{y}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{pct}%</text>')
    for g, r in enumerate(results):
        x0 = left + g * group_w + 12
        for i, arm in enumerate(ARMS):
            a = r["arms"][arm]
            x, h = x0 + i * bar_w, a["rate"] * height
            lo, hi = (top + height - v * height for v in a["ci95"])
            out.append(f'<rect x="{x}" y="{top + height - h}" width="{bar_w - 3}" height="{h}" fill="{colours[arm]}"/>'
                       f'<line x1="{x + 7}" x2="{x + 7}" y1="{lo}" y2="{hi}" stroke="black"/>')
        label = f'{r["task"].removesuffix("-v3")} B={r["budget_episodes"]}'
        out.append(f'<text x="{x0 + 2 * bar_w}" y="{top + height + 14}" text-anchor="middle">{label}</text>')
    for i, arm in enumerate(ARMS):
        y = top + 14 * i
        out.append(f'<rect x="{width - 110}" y="{y}" width="10" height="10" fill="{colours[arm]}"/>'
                   f'<text x="{width - 95}" y="{y + 9}">{arm}</text>')
    out.append(f'<text x="{left}" y="16">success rate over held-out seeds (95% Wilson interval), equal label '
               'budgets</text></svg>')
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help=f"Meta-World tasks (default: {DEFAULT_TASKS})")
    parser.add_argument("--budgets", default="10", help="label budgets in expert episodes (default: 10)")
    parser.add_argument("--eval-episodes", type=int, default=50, help="held-out evaluation episodes (default: 50)")
    parser.add_argument("--train-steps", type=int, default=3000, help="MLP training steps, every arm (default: 3000)")
    parser.add_argument("--sigma", type=float, default=0.2, help="noise arm's gaussian scale (default: 0.2)")
    parser.add_argument("--beta", type=float, default=0.5, help="DAgger arm's expert mixture (default: 0.5)")
    parser.add_argument("--rounds", type=int, default=2, help="DAgger/takeover rounds after the expert half (default: 2)")
    parser.add_argument("--gap", type=float, default=0.5, help="takeover rule's bound (default: 0.5)")
    parser.add_argument("--gap-steps", type=int, default=5, help="takeover rule's steps (default: 5)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-policy-loop"),
                        help="where results.json and results.svg go (default: runs/bench-policy-loop)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    started = time.monotonic()
    print(f"load average {os.getloadavg()[0]:.2f}; tasks {args.tasks}; budgets {args.budgets}; "
          f"eval {args.eval_episodes} episodes; {args.train_steps} training steps", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-policy-loop-") as scratch:
        for budget in (int(b) for b in args.budgets.split(",")):
            for task in args.tasks.split(","):
                results.append(bench_task(task, budget, args, Path(scratch)))
                (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.svg").write_text(svg(results))
    print(f"\n{'task':26s} {'B':>3s} {'frames':>6s} " + " ".join(f"{a:>16s}" for a in ARMS) + "  best-(a)")
    for r in results:
        cells = []
        for arm in ARMS:
            a = r["arms"][arm]
            cells.append(f"{a['rate']:4.0%} ({a['ci95'][0]:.0%}-{a['ci95'][1]:.0%})")
        best = max(r["arms"][a]["rate"] for a in ARMS[1:]) - r["arms"]["expert"]["rate"]
        print(f"{r['task']:26s} {r['budget_episodes']:3d} {r['budget_frames']:6d} "
              + " ".join(f"{c:>16s}" for c in cells) + f"  {best * 100:+.0f} points")
    wins = sum(1 for r in results if max(r["arms"][a]["rate"] for a in ARMS[1:]) - r["arms"]["expert"]["rate"] >= 0.15)
    print(f"\nan arm (b)-(d) beats (a) by >= 15 points on {wins} of {len(results)} task/budget pairs; "
          f"{time.monotonic() - started:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
