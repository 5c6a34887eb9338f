"""``demoforge eval``: run a policy in a demoforge task for N seeded episodes and report its success."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from demoforge.pipeline.cli.common import EXIT_OK, add_command, add_randomize_option, make_console, task_options
from demoforge.pipeline.workers.config import ExecutorConfig
from demoforge.stages.control import DEFAULT_POLICY_TIMEOUT_S

# Imported where used: the job runner (zarr, PyAV, the simulators), which `demoforge --help` need not load.

EXAMPLE = ("demoforge eval --task metaworld-push-v3 --option camera=none --option full_state=true "
           "--driver outputs/train/checkpoints/last/pretrained_model --episodes 50 --seed 1000")


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "eval", help="run a policy (LeRobot checkpoint or module:factory) in a task for N seeded "
                                      "episodes; report success rate, mean length and how far along the "
                                      "expert's phases it got", example=EXAMPLE)
    p.add_argument("--task", required=True, help="a task name (`demoforge tasks`) whose expert can label any "
                                                 "state. Required")
    p.add_argument("--driver", required=True, metavar="PATH_OR_SPEC",
                   help="the policy: a LeRobot checkpoint folder (pretrained_model) or module:factory. Required")
    p.add_argument("--episodes", type=int, default=50, help="seeded episodes to run (default: 50)")
    p.add_argument("--seed", type=int, default=0,
                   help="the evaluation's job seed; keep it apart from the seeds the policy was trained on "
                        "(default: 0)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a task option, e.g. --option full_state=true (default: the task's)")
    add_randomize_option(p)
    p.add_argument("--executor", choices=["thread", "process"], default="thread",
                   help="where the episodes run (default: thread)")
    p.add_argument("--workers", type=int, default=1, help="parallel env workers (default: 1)")
    p.add_argument("--policy-timeout", type=float, default=DEFAULT_POLICY_TIMEOUT_S, metavar="SECONDS",
                   help="seconds one call of the policy may take; a call that takes longer fails its episode "
                        "(counted, with the reason) and the policy is loaded again for the next one (0: no limit)")
    p.add_argument("--store", type=Path, default=None,
                   help="keep the rollouts as a store there (each frame labelled by the expert; exportable); "
                        "default: none kept")
    p.add_argument("--json", action="store_true", help="print the report as JSON (default: a table)")
    p.set_defaults(fn=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from demoforge.pipeline.evaluation import evaluate
    from demoforge.pipeline.job import JobConfigError

    if args.episodes < 1:
        raise JobConfigError(f"--episodes must be >= 1, got {args.episodes}")
    if not args.policy_timeout >= 0:  # NaN too
        raise JobConfigError(f"--policy-timeout must be >= 0 seconds (0: no limit), got {args.policy_timeout}")
    err = make_console(stderr=True)
    executor = ExecutorConfig(kind=args.executor, workers=args.workers)
    last = [-1]

    def on_progress(stats) -> None:
        # Episodes run: committed, and ended by an error (each episode runs once; an interrupted attempt reruns)
        ran = stats.total_committed + sum(n for reason, n in stats.discarded.items() if reason != "interrupted")
        if ran != last[0] and (ran % 10 == 0 or ran >= stats.target):
            last[0] = ran
            err.print(f"eval: {ran}/{stats.target} episodes", markup=False)

    report = evaluate(args.task, args.driver, args.episodes, seed=args.seed, task_options=task_options(args),
                      executor=executor, store=args.store, on_progress=on_progress,
                      on_event=lambda line: err.print(line, markup=False),
                      policy_timeout_s=args.policy_timeout or None)
    out = make_console()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return EXIT_OK
    low, high = report.interval
    n = len(report.episodes)
    errors = report.errors
    out.print(f"{report.task}, driver {report.driver}: success {report.successes}/{n} = {report.success_rate:.0%} "
              f"(95% CI {low:.0%}-{high:.0%}), mean length {report.mean_length:.1f} frames"
              + (f", {sum(errors.values())} episode(s) ended by an error (counted as failed)" if errors else "")
              + f"; seed {report.seed}, {report.elapsed_s:.1f} s", markup=False, highlight=False)
    for reason, count in list(errors.items())[:3]:  # why, most frequent first
        out.print(f"  {count} x {reason}", markup=False, highlight=False)
    if report.reach:
        out.print("reach (episodes that got at least as far as each of the expert's phases): "
                  + ", ".join(f"{name} {share:.0%}" for name, share in report.reach.items()), markup=False,
                  highlight=False)
    if report.store:
        out.print(f"rollouts kept in {report.store} (export them with `demoforge export --store {report.store}`)",
                  markup=False)
    return EXIT_OK
