"""``demoforge multiply``: a job like ``generate`` whose expert is a few source demonstrations, moved segment by
segment to each new scene (pipeline/multiply.py; docs/multiply.md). Resumable, on every executor, with
generate's options: the same job machinery, the wrapper task naming the source."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from demoforge.pipeline.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_command,
    add_control_options,
    add_job_options,
    job_progress,
    make_console,
    task_options,
)
from demoforge.pipeline.cli.generate import add_run_options
from demoforge.pipeline.flags import runaway_message

EXAMPLE = ("demoforge multiply runs/fetch-10 --episodes 1000 --store runs/fetch-1000 --export runs/fetch-1000-dataset "
           "--strategy nearest")


def add_multiply_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "multiply", example=EXAMPLE,
                    help="make N new demonstrations from a few recorded ones, segment by segment, each moved with "
                         "the object it acts on (MimicGen's scheme); resumable like generate")
    p.add_argument("source", type=Path, metavar="SOURCE",
                   help="a store or an exported dataset of one task, of 2 or more episodes with segments with "
                        "targets (written by generate, an earlier multiply, or a Recorder loop that recorded its "
                        "poses: name its task with --task; docs/multiply.md)")
    add_job_options(p)
    p.set_defaults(task=None)  # the source's task (a Recorder's names none: --task is required)
    add_control_options(p)
    add_run_options(p)
    p.add_argument("--strategy", choices=("random", "nearest"), default="random",
                   help="which source episode gives each segment: random (drawn from the attempt's seed) or "
                        "nearest (the one whose target object started nearest to where it is now)")
    p.add_argument("--interpolation", type=int, default=5, metavar="K",
                   help="steps that bring the end effector from where it is to the start of each moved segment")
    p.set_defaults(fn=cmd_multiply)


def cmd_multiply(args: argparse.Namespace) -> int:
    from demoforge.pipeline.cli.generate import _executor_config, _job_spec, _workers_note, export_after_job
    from demoforge.pipeline.multiply import MAX_INTERPOLATION, SOURCE_DIR, TASK, MultiplyInputError, extract_source
    from demoforge.pipeline.multiply_plan import source_file_name
    from demoforge.pipeline.runner import JobRunner, JobStats
    from demoforge.storage.store import open_store

    if not 0 <= args.interpolation <= MAX_INTERPOLATION:
        raise MultiplyInputError(f"--interpolation must be in 0..{MAX_INTERPOLATION} steps, got {args.interpolation}")
    executor = _executor_config(args)
    base = _job_spec(args)  # the job's own options, checked before the source is read
    err = make_console(stderr=True)
    prepared = extract_source(args.source, args.task, task_options(args),
                              on_note=lambda line: err.print(f"demoforge multiply: warning: {line}", markup=False))
    store = Path(args.store)
    file = store.resolve() / SOURCE_DIR / source_file_name(prepared.source.content_hash())
    spec = replace(base, task=TASK, task_options=prepared.job_options(file, args.strategy, args.interpolation))
    progress = job_progress(err)
    last_line = [0.0]

    def on_progress(stats: JobStats) -> None:
        discarded = sum(stats.discarded.values())
        detail = f"attempts {stats.attempts}  discarded {discarded}  {stats.frames_per_s():.0f} frames/s"
        progress.update(bar, completed=min(stats.total_committed, stats.target), detail=detail)
        if not err.is_terminal and (time.monotonic() - last_line[0] > 5 or stats.total_committed >= stats.target):
            last_line[0] = time.monotonic()
            err.print(f"committed {stats.total_committed}/{stats.target}  {detail}", markup=False)

    runner = JobRunner(spec, store, on_progress, executor=executor,
                       on_event=lambda line: err.print(line, markup=False, highlight=False))
    # The job is bound to its store, then the extracted source is written beside it (the store refuses to be
    # created in a folder that holds anything else): nothing is written before every check above has passed.
    with open_store(store, "w", fingerprint=spec.fingerprint(runner.info)):
        prepared.source.save(file.parent)
    err.print(f"multiplying {len(prepared.source.episodes)} source episode(s) of {prepared.task} "
              f"({len(prepared.source.sequence)} segments: {' '.join(prepared.source.sequence)}) into {spec.episodes} "
              "episode(s)", markup=False)
    bar = progress.add_task(f"multiply {prepared.task}", total=runner.target, detail="")
    with progress:
        import anyio  # here: `demoforge --help` and the store commands need none of it

        report = anyio.run(lambda: runner.run(handle_signals=True))
    return _report(args, spec, report, _workers_note(report), export_after_job)


def _report(args: argparse.Namespace, spec: Any, report: Any, workers: str, export_after_job: Any) -> int:
    out = make_console()
    out.print(report.recovery.describe())
    discarded = sum(report.discarded.values())
    attempts = report.committed_this_run + discarded + sum(report.failures_kept.values())
    reasons = ", ".join(f"{k}={v}" for k, v in sorted(report.discarded.items())) or "none"
    rate = (f"{report.committed_this_run}/{attempts} attempts succeeded ({attempts / report.committed_this_run:.2f} "
            "attempts per success)" if report.committed_this_run else f"0/{attempts} attempts succeeded")
    ended = "stopped" if report.interrupted or report.runaway else "done"
    out.print(f"{ended}: {report.committed_total}/{report.target} episodes committed in {args.store} "
              f"({report.committed_this_run} this run, {report.frames_this_run} frames, {report.elapsed_s:.1f} s); "
              f"generation: {rate}; discarded attempts: {reasons}; abandoned episodes: {report.abandoned}{workers}",
              markup=False)
    if spec.keep_failures:
        out.print(f"failures kept: {report.failures_kept_total} in the store; export them with `demoforge export "
                  f"--store {args.store} --include failures` (or all)", markup=False)
    if report.runaway is not None:
        make_console(stderr=True).print(
            f"demoforge multiply: error: stopped because {runaway_message(report.runaway)}. The {report.committed_total} "
            "committed episode(s) are kept; the source's segments may not carry over to these scenes (try "
            "--strategy nearest, more --interpolation steps or more source episodes), then re-run the same command "
            "to resume.", markup=False)
        return EXIT_FAIL
    if not report.complete:
        out.print(f"re-run the same command to resume: {report.target - report.committed_total} episode(s) to go",
                  markup=False)
    elif args.export is not None:
        return int(export_after_job(args.store, args.export, args.repo_id, args.export_timeout, command="multiply"))
    return EXIT_OK if report.complete or report.interrupted else EXIT_FAIL
