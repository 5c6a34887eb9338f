"""``demoforge generate``: run a job into its store until its target is committed (resumable), then, with
``--export``, export it in a watched child process."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from demoforge.pipeline.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_codec_option,
    add_command,
    add_control_options,
    add_job_options,
    job_progress,
    control_spec,
    make_console,
    task_options,
)
from demoforge.pipeline.export_child import DEFAULT_PROGRESS_TIMEOUT_S, export_in_child
from demoforge.pipeline.flags import runaway_message
from demoforge.pipeline.job import DEFAULT_MAX_CONSECUTIVE_ABANDONED, ENCODER_PRIORITY_CHOICES, JobSpec, VideoSettings
from demoforge.pipeline.workers.config import ExecutorConfig

# Imported where used: the job runner and the daemon's event log (they load zarr and PyAV) and rich's progress
# bar, which `demoforge --help` need not load.

#: Also the example `demoforge --help` ends with.
EXAMPLE = "demoforge generate --task fetch-pick-place --episodes 10 --store runs/fetch --export runs/fetch-dataset"


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "generate", help="generate episodes into a store until N are committed (resumable)",
                    example=EXAMPLE)
    add_job_options(p)
    add_control_options(p)
    add_run_options(p)
    p.set_defaults(fn=cmd_generate)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Where and how a job runs into its store, and what follows it (also `demoforge multiply`'s)."""
    p.add_argument("--store", type=Path, required=True,
                   help="the job's store folder (created if new; re-run with the same one to resume). Required")
    p.add_argument("--workers", type=int, default=1,
                   help="env workers: threads, processes or Ray actors, per --executor (remote executors: the "
                        "most that run at once; a Ray job carries on with fewer while the cluster lacks room)")
    p.add_argument("--executor", choices=["thread", "process", "ray"], default="thread",
                   help="where env workers run: threads in this process, worker processes on this machine, or "
                        "Ray actors (see docs/scale-out.md)")
    p.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                   help="join a running Ray cluster (HOST:PORT or auto; default: start a local Ray)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs Ray reserves for each actor")
    p.add_argument("--start-timeout", type=float, default=180.0, metavar="SECONDS",
                   help="process and Ray executors: stop with exit status 1 when no worker has been running for "
                        "this long (none could be placed, or all were lost and none replaced)")
    p.add_argument("--max-in-flight", type=int, default=4,
                   help="pieces (of up to 16 encoded frames) a remote worker may run ahead of the writer")
    p.add_argument("--num-envs", type=int, default=1, help="vector-env rows per worker")
    add_codec_option(p)
    p.add_argument("--crf", type=int, default=30, help="encoder quality (lower: better, larger)")
    p.add_argument("--gop", type=int, default=2, help="keyframe interval")
    p.add_argument("--encoder-threads", type=int, default=None,
                   help="threads per camera encoder (default: the codec decides)")
    p.add_argument("--encoder-process", choices=("auto", "on", "off"), default="auto",
                   help="run each worker's encoders in a process of their own, so encoding does not slow the "
                        "simulator's process (auto: when the cameras have at least 128x128 pixels per frame in "
                        "all); the video is byte-identical either way (default: auto)")
    p.add_argument("--encoder-priority", choices=tuple(ENCODER_PRIORITY_CHOICES), default="auto",
                   help="the encoder process's encoders at idle priority (SCHED_IDLE), raised to normal whenever "
                        "the worker waits for them, so the simulator gets the cores first (docs/performance.md "
                        "measures it). auto: idle wherever the encoder process runs; idle: also turns the encoder "
                        "process on under auto; normal: never (default: auto)")
    p.add_argument("--queue-frames", type=int, default=32, help="capacity of each inter-stage queue")
    p.add_argument("--step-timeout", type=float, default=60.0,
                   help="seconds an env call may take before its attempt is aborted (0: no limit)")
    p.add_argument("--max-consecutive-abandoned", type=int, default=DEFAULT_MAX_CONSECUTIVE_ABANDONED,
                   metavar="K", help="stop with exit status 1 when the last K episodes were all abandoned (every "
                                     "attempt failed); 0: never")
    p.add_argument("--keep-failures", action="store_true",
                   help="also commit failed, truncated and invalid attempts as episodes of their own, with their "
                        "failure reason and failed segment (--episodes still counts successes; `demoforge export "
                        "--include failures|all` exports them). Fixed for the life of the store (default: off)")
    p.add_argument("--export", type=Path, default=None, metavar="DATASET_DIR",
                   help="when the target is reached, export to this LeRobot dataset (the job's episodes: "
                        "`demoforge export --include` for kept failures)")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the exported dataset")
    p.add_argument("--json-logs", action="store_true",
                   help="also print one JSON line per committed episode on stderr, once it is durable "
                        "(event episode_committed: episode, index, frames)")
    p.add_argument("--export-timeout", type=float, default=DEFAULT_PROGRESS_TIMEOUT_S, metavar="SECONDS",
                   help="end the export (--export) when it reports no progress for this long: it exits with "
                        "status 1 and the dataset keeps its last published version")


ENCODER_PROCESS_CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def _executor_config(args: argparse.Namespace) -> ExecutorConfig:
    return ExecutorConfig(kind=args.executor, workers=args.workers, ray_address=args.ray_address,
                          cpus_per_worker=args.cpus_per_worker, max_in_flight=args.max_in_flight,
                          start_timeout_s=args.start_timeout)


def _job_spec(args: argparse.Namespace) -> JobSpec:
    video = VideoSettings(codec=args.codec, crf=args.crf, g=args.gop, encoder_threads=args.encoder_threads)
    # Remote workers are counted by the executor's config (up to 1024); env threads by the job (up to 64).
    threads = args.workers if args.executor == "thread" else 1
    return JobSpec(task=args.task, episodes=args.episodes, task_options=task_options(args),
                   seed=args.seed, max_attempts=args.max_attempts, workers=threads, num_envs=args.num_envs,
                   video=video, queue_frames=args.queue_frames, step_timeout_s=args.step_timeout or None,
                   max_consecutive_abandoned=args.max_consecutive_abandoned, control=control_spec(args),
                   keep_failures=args.keep_failures, encoder_process=ENCODER_PROCESS_CHOICES[args.encoder_process],
                   encoder_idle=ENCODER_PRIORITY_CHOICES[args.encoder_priority])


def cmd_generate(args: argparse.Namespace) -> int:
    from demoforge.pipeline.runner import JobRunner

    executor = _executor_config(args)
    spec = _job_spec(args)
    console = make_console(stderr=True)
    progress = _Progress(console)
    runner = JobRunner(spec, args.store, progress.update, on_outcome=_json_commits(args.json_logs), executor=executor,
                       on_event=lambda line: console.print(line, markup=False, highlight=False))
    if runner.info.suite:
        console.print(f"{spec.task}: {len(runner.info.suite)} tasks x {spec.episodes} episode(s) = {runner.target}",
                      markup=False)
    with progress.shown(spec.task, runner.target):
        import anyio  # here: `demoforge --help` and the store commands need none of it

        report = anyio.run(lambda: runner.run(handle_signals=True))
    _print_report(args, spec, report)
    failed = _stopped_itself(spec, report)
    if failed is not None:
        return failed
    if not report.complete:
        make_console().print(f"re-run the same command to resume: {report.target - report.committed_total} "
                             "episode(s) to go")
    elif args.export is not None:
        return export_after_job(args.store, args.export, args.repo_id, args.export_timeout)
    return EXIT_OK if report.complete or report.interrupted else EXIT_FAIL


class _Progress:
    """The job's progress bar, a line per suite task as it completes, and a line every 5 s without a terminal."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.progress = job_progress(console)
        self.bar: Any = None
        self.last_line = 0.0
        self.finished_tasks: set[str] = set()

    @contextmanager
    def shown(self, task: str, target: int) -> Iterator[None]:
        self.bar = self.progress.add_task(f"{task}", total=target, detail="")
        with self.progress:
            self.progress.update(self.bar, completed=0)
            yield

    def update(self, stats: Any) -> None:
        target, console = stats.target, self.console
        detail = (f"discarded {sum(stats.discarded.values())}  {stats.frames_per_s():.0f} frames/s  "
                  f"queues {stats.queue_depths()}")
        if stats.per_task:  # a suite: the task being worked on, and a line for each task as it completes
            working = next((t for t, n in stats.per_task.items() if n < stats.per_task_target), None)
            if working is not None:
                detail = f"{working} {stats.per_task[working]}/{stats.per_task_target}  {detail}"
            for task, count in stats.per_task.items():
                if count >= stats.per_task_target and task not in self.finished_tasks:
                    self.finished_tasks.add(task)
                    console.print(f"{task}: {count}/{stats.per_task_target} committed", markup=False)
        self.progress.update(self.bar, completed=min(stats.total_committed, target), detail=detail)
        if not console.is_terminal:
            if time.monotonic() - self.last_line > 5 or stats.total_committed >= target:
                self.last_line = time.monotonic()
                console.print(f"committed {stats.total_committed}/{target}  {detail}", markup=False)


def _json_commits(json_logs: bool) -> Callable[[Any], None] | None:
    """``--json-logs``: one JSON line per commit, on stderr, once the episode is durable."""
    if not json_logs:
        return None
    from demoforge.pipeline.daemon import EventLog

    events = EventLog(True)

    def on_outcome(item: Any) -> None:
        if item.ended.result.committable:
            events.emit("episode_committed", episode=item.ended.key.episode_id,
                        index=item.ended.key.episode_index, frames=item.ended.frames)

    return on_outcome


def _print_report(args: argparse.Namespace, spec: JobSpec, report: Any) -> None:
    """What the run did: recovery, committed, discarded and abandoned, kept failures, a suite's short tasks."""
    out = make_console()
    out.print(report.recovery.describe())
    discarded = ", ".join(f"{k}={v}" for k, v in sorted(report.discarded.items())) or "none"
    ended = "stopped" if report.interrupted or report.runaway else "done"
    out.print(f"{ended}: {report.committed_total}/{report.target} episodes "
              f"committed in {args.store} ({report.committed_this_run} this run, {report.frames_this_run} frames, "
              f"{report.frames_this_run / max(report.elapsed_s, 1e-9):.0f} frames/s, {report.elapsed_s:.1f} s); "
              f"discarded attempts: {discarded}; abandoned episodes: {report.abandoned}{_workers_note(report)}")
    if spec.keep_failures:
        kept = ", ".join(f"{k}={v}" for k, v in sorted(report.failures_kept.items())) or "none"
        out.print(f"failures kept: {report.failures_kept_total} in the store ({kept} this run); export them with "
                  f"`demoforge export --store {args.store} --include failures` (or all)", markup=False)
    for task in report.per_task:  # a suite: the tasks that did not reach their target, or lost episodes
        if task.committed < spec.episodes or task.abandoned:
            out.print(f"  {task.task}: {task.committed}/{spec.episodes} committed"
                      + (f", {task.abandoned} episode(s) abandoned (all {spec.max_attempts} attempts failed, "
                         "--max-attempts)" if task.abandoned else "")
                      + (", given up: too many abandoned in a row" if task.runaway else ""), markup=False)


def _stopped_itself(spec: JobSpec, report: Any) -> int | None:
    """EXIT_FAIL, said on stderr, when the job (or tasks of its suite) gave up after too many abandoned episodes."""
    given_up = [t for t in report.per_task if t.runaway is not None]
    if given_up:
        make_console(stderr=True).print(
            f"demoforge generate: error: gave up {len(given_up)} task(s) of the suite; "
            + "; ".join(f"{t.task}: {runaway_message(t.runaway)}" for t in given_up if t.runaway)
            + f". The {report.committed_total} committed episode(s) are kept; fix the task(s) (try `demoforge run "
            f"--task {given_up[0].task}`), then re-run the same command to resume.", markup=False)
        return EXIT_FAIL
    if report.runaway is not None:
        driver = spec.control.driver if spec.control is not None else None
        fix = (f"fix the policy (--driver {driver}) or the task (`demoforge eval` runs the policy alone and names "
               "what it did)" if driver else "fix the task (try `demoforge run` to watch a few episodes)")
        make_console(stderr=True).print(f"demoforge generate: error: stopped because "
                                        f"{runaway_message(report.runaway)}. The {report.committed_total} committed "
                                        f"episode(s) are kept; {fix}, then re-run the same command to resume.",
                                        markup=False)
        return EXIT_FAIL
    return None


def _workers_note(report: Any) -> str:
    """Remote workers at the end of the run, when some were lost or the cluster had no room for all."""
    count = report.workers
    if count is None or (count.lost == 0 and count.running == count.wanted):
        return ""
    return f"; workers lost: {count.lost}, {count.running} of {count.wanted} running at the end"


def export_after_job(store: Path, out: Path, repo_id: str | None, progress_timeout_s: float,
                     command: str = "generate") -> int:
    """``generate --export``: the export runs as a watched child process (its memory is returned when it ends;
    one that stops making progress is ended, pipeline/export_child.py). Its own output is shown as it comes."""
    import anyio  # here: `demoforge --help` and the store commands need none of it

    outcome = anyio.run(lambda: export_in_child(store, out, repo_id, progress_timeout_s=progress_timeout_s,
                                                capture_output=False))
    err = make_console(stderr=True)
    retry = f"run `demoforge export --store {store} --out {out}` to retry"
    if outcome.stalled is not None:
        where = f"; its threads' stacks are in {outcome.stacks}" if outcome.stacks else ""
        if outcome.ok:
            report = outcome.report or {}
            make_console().print(f"exported {report.get('exported')} episode(s) to {out} (version "
                                 f"{report.get('version')}); the dataset now holds {report.get('total_episodes')} "
                                 f"episodes. The export process was ended because {outcome.stalled}{where}",
                                 markup=False)
            return EXIT_OK
        err.print(f"demoforge {command}: error: the export was ended because {outcome.stalled}{where}. The dataset "
                  f"{out} stays at its last published version and the store is intact; {retry} (--export-timeout "
                  "sets how long an export may go without progress)", markup=False)
        return EXIT_FAIL
    if outcome.returncode < 0:
        err.print(f"demoforge {command}: error: the export process was {outcome.exit_text()}; the dataset {out} "
                  f"stays at its last published version and the store is intact; {retry}", markup=False)
        return EXIT_FAIL
    return outcome.returncode
