"""``demoforge rerender``: re-simulate a recorded job's episodes with new observations (other sizes, cameras,
depth, appearance variants) into a new store, resumable, then export it as a new dataset."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from demoforge.pipeline.cli.common import (
    APPEARANCE_AXES,
    EXIT_FAIL,
    EXIT_OK,
    add_codec_option,
    add_command,
    add_randomize_option,
    job_progress,
    make_console,
    parse_options,
)
from demoforge.pipeline.export_child import DEFAULT_PROGRESS_TIMEOUT_S

EXAMPLE = ("demoforge rerender runs/push-dataset --out runs/push-96 --option image_size=96 "
           "--camera corner2 --camera topview --workers 2")


def add_rerender_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "rerender", help="re-simulate a store's or dataset's episodes from their seeds and actions "
                                          "and record new observations (sizes, cameras, depth, appearance "
                                          "variants) into a new dataset; resumable", example=EXAMPLE)
    p.add_argument("source", type=Path, metavar="STORE_OR_DATASET",
                   help="a store or a dataset written by `demoforge export` (one task, expert-driven episodes)")
    p.add_argument("--out", type=Path, required=True, metavar="DATASET_DIR",
                   help="the new LeRobot dataset, published when every episode has been rerendered: absent or an "
                        "empty folder (or this rerender's own, to resume), apart from the source. Required")
    p.add_argument("--store", type=Path, default=None,
                   help="the rerender job's store (re-run the same command to resume); default: OUT.store")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an appearance option of the task, e.g. image_size=96 (`demoforge tasks NAME`; anything "
                        "that could change the physics is refused); default: the source's options")
    p.add_argument("--camera", action="append", default=[], metavar="NAME",
                   help="record this camera (repeat for several): the task's 'camera' option; default: the "
                        "source's cameras")
    p.add_argument("--depth", action="store_true", help="also record each camera's depth (the task's 'depth' "
                                                          "option; default: as the source)")
    add_randomize_option(p, APPEARANCE_AXES)
    p.add_argument("--variants", type=int, default=1, metavar="K",
                   help="appearance variants per source episode: variant v > 0 redraws the appearance axes "
                        "(--randomize lighting,colors,camera) from the episode's seed and v")
    p.add_argument("--workers", type=int, default=1, help="env workers (threads, or processes with --executor)")
    p.add_argument("--executor", choices=["thread", "process", "ray"], default="thread",
                   help="where env workers run (docs/scale-out.md)")
    add_codec_option(p)
    p.add_argument("--crf", type=int, default=30, help="encoder quality (lower: better, larger)")
    p.add_argument("--gop", type=int, default=2, help="keyframe interval")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the new dataset")
    p.add_argument("--export-timeout", type=float, default=DEFAULT_PROGRESS_TIMEOUT_S, metavar="SECONDS",
                   help="end the export when it reports no progress for this long (exit 1)")
    p.set_defaults(fn=cmd_rerender)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from demoforge.pipeline.tasks.registry import TaskOptionError

    overrides = parse_options(args.option)
    for flag, key, value in (("--camera", "camera", ",".join(args.camera) if args.camera else None),
                             ("--depth", "depth", True if args.depth else None),
                             ("--randomize", "randomize", args.randomize)):
        if value is None:
            continue
        if key in overrides:
            raise TaskOptionError(f"give {key} once: {flag} or --option {key}=..., not both")
        overrides[key] = value
    return overrides


def cmd_rerender(args: argparse.Namespace) -> int:
    from demoforge.pipeline.job import JobSpec, VideoSettings
    from demoforge.pipeline.workers.config import ExecutorConfig

    plan, store = _checked_plan(args)
    threads = args.workers if args.executor == "thread" else 1
    spec = JobSpec(task=plan.task, episodes=plan.sources * args.variants, task_options=plan.options, seed=0,
                   max_attempts=1, workers=threads, max_consecutive_abandoned=0, rerender=plan.spec,
                   video=VideoSettings(codec=args.codec, crf=args.crf, g=args.gop))
    report, failures = _run(spec, store, ExecutorConfig(kind=args.executor, workers=args.workers))
    return _report_and_export(args, plan, store, report, failures)


def _checked_plan(args: argparse.Namespace) -> tuple[Any, Path]:
    """The checked rerender plan and the job's store, refused (TaskOptionError) before anything is written."""
    from demoforge.pipeline.rerender import RerenderInputError, check_rerender_output, plan_rerender
    from demoforge.pipeline.tasks.registry import TaskOptionError, get_task

    overrides = _overrides(args)
    try:
        plan = plan_rerender(args.source, overrides, args.variants)
        entry = get_task(plan.task)
        for key in ("camera", "depth"):
            if key in overrides and key not in entry.all_defaults:
                raise RerenderInputError(f"--{key}: task {plan.task!r} has no {key!r} option (its options: "
                                         f"{', '.join(sorted(entry.defaults))})")
        if args.store is None and args.out.name in ("", ".", ".."):
            raise RerenderInputError(f"--out {str(args.out)!r} names no new folder: give the new dataset's path")
        store: Path = args.store or args.out.with_name(args.out.name + ".store")
        check_rerender_output(args.source, args.out, store)
    except RerenderInputError as exc:
        raise TaskOptionError(str(exc)) from None
    return plan, store


def _run(spec: Any, store: Path, executor: Any) -> tuple[Any, dict[int, str]]:
    """Run the rerender job with a progress bar; its report and why each episode that diverged did."""
    from demoforge.pipeline.runner import JobRunner, JobStats

    console = make_console(stderr=True)
    failures: dict[int, str] = {}

    def on_outcome(item: Any) -> None:
        result = item.ended.result
        if not result.committable:
            failures[item.ended.key.episode_index] = result.failure_reason or result.terminal_reason.value

    progress = job_progress(console)
    last_line = [0.0]

    def on_progress(stats: JobStats) -> None:
        detail = f"{stats.frames_per_s():.0f} frames/s, diverged {len(failures)}"
        progress.update(bar, completed=min(stats.total_committed + len(failures), spec.episodes), detail=detail)
        if not console.is_terminal and time.monotonic() - last_line[0] > 5:
            last_line[0] = time.monotonic()
            console.print(f"rerendered {stats.total_committed}/{spec.episodes}  {detail}", markup=False)

    runner = JobRunner(spec, store, on_progress, on_outcome=on_outcome, executor=executor,
                       on_event=lambda line: console.print(line, markup=False, highlight=False))
    bar = progress.add_task(f"rerender {spec.task}", total=spec.episodes, detail="")
    with progress:
        import anyio  # here: `demoforge --help` and the store commands need none of it

        return anyio.run(lambda: runner.run(handle_signals=True)), failures


def _report_and_export(args: argparse.Namespace, plan: Any, store: Path, report: Any,
                       failures: dict[int, str]) -> int:
    """Say what was rerendered and what diverged; export what was unless the run was stopped or made nothing."""
    from demoforge.pipeline.cli.generate import export_after_job

    episodes = plan.sources * args.variants
    out = make_console()
    out.print(f"rerendered {report.committed_total}/{episodes} episodes ({plan.sources} source episode(s) x "
              f"{args.variants} variant(s)) into {store} ({report.frames_this_run} frames this run, "
              f"{report.frames_this_run / max(report.elapsed_s, 1e-9):.0f} frames/s, {report.elapsed_s:.1f} s)",
              markup=False)
    for index, reason in sorted(failures.items()):
        source, variant = plan.spec.locate(index)
        out.print(f"  not rerendered: episode {index} (source episode #{source}, variant {variant}): {reason}",
                  markup=False)
    if report.interrupted:
        out.print("stopped: re-run the same command to resume")
        return EXIT_OK
    if report.committed_total == 0:
        make_console(stderr=True).print("demoforge rerender: error: no episode could be rerendered; nothing is "
                                        "exported", markup=False)
        return EXIT_FAIL
    code = export_after_job(store, args.out, args.repo_id, args.export_timeout, command="rerender")
    if code == EXIT_OK and report.committed_total < episodes:
        out.print(f"{episodes - report.committed_total} episode(s) could not be rerendered (their "
                  "re-simulation diverged from the source; see above or `demoforge inspect` of the store): exit 1",
                  markup=False)
        return EXIT_FAIL
    return code
