"""The ``demoforge`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any


from rich.console import Console
from rich.table import Table

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_STATUS_HELP = """exit status: 0 done; 1 failed or incomplete (e.g. every recent episode abandoned); 2 bad input or
settings; 3 the daemon stopped a failing job; 4 an OS error while writing (e.g. a full disk); 130 interrupted"""


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------------------------- tasks
def _task_row(name: str) -> dict[str, Any]:
    from demoforge.pipeline.tasks.registry import get_task

    entry = get_task(name)
    info = entry.info()
    return {"name": name, "description": info.description, "fps": info.fps,
            "cameras": {c.name: list(c.shape) for c in info.cameras},
            "camera_kinds": {c.name: c.kind for c in info.cameras},
            "action_shape": list(info.action_shape),
            "state_shapes": {k: list(v) for k, v in info.state_shapes.items()},
            "segments": list(info.segment_names),
            "options": entry.resolve_options()}  # every option (the fingerprint leaves some defaults out)


def _segment_summary(names: Sequence[str]) -> str:
    """``15 (reach_0 ... release_2)``: a count that never makes the table wrap; full list with ``tasks NAME``."""
    unique = list(dict.fromkeys(names))
    if len(unique) <= 2:
        return f"{len(unique)} ({' '.join(unique)})"
    return f"{len(unique)} ({unique[0]} ... {unique[-1]})"


def cmd_tasks(args: argparse.Namespace) -> int:
    from demoforge.pipeline.tasks.registry import plugin_failures, task_names

    if args.name:
        return _print_task(_task_row(args.name), json_out=args.json)
    from demoforge.pipeline.tasks.registry import TaskDefinitionError

    rows: list[dict[str, Any]] = []
    unusable: dict[str, list[str]] = {}
    for name in task_names():
        try:
            rows.append(_task_row(name))
        except TaskDefinitionError as exc:  # e.g. a simulator of the wrong version: list the others
            unusable.setdefault(str(exc).split(": ", 1)[-1], []).append(name)
    failures = [*plugin_failures(), *(f"{len(names)} task(s) ({names[0]}, ...) cannot be used: {why}"
                                      for why, names in unusable.items())]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console = Console(highlight=False)

        def cells_of(compact: bool) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
            """Full cells, or (on a narrow terminal) camera sizes without names and no action column."""
            cams = [", ".join(f"{v[0]}x{v[1]}" if compact else f"{k} {v[0]}x{v[1]}" for k, v in r["cameras"].items())
                    or "-" for r in rows]
            if compact:
                return ("task", "fps", "cameras"), [(r["name"], str(r["fps"]), c) for r, c in zip(rows, cams)]
            return ("task", "fps", "cameras", "action"), [(r["name"], str(r["fps"]), c, str(tuple(r["action_shape"])))
                                                          for r, c in zip(rows, cams)]

        def width(cols: tuple[str, ...], cells: list[tuple[str, ...]]) -> int:
            return sum(max([len(col)] + [len(c[i]) for c in cells]) + 2 for i, col in enumerate(cols))

        columns, cells = cells_of(compact=False)
        longest = max((len(_segment_summary(r["segments"])) for r in rows), default=0)
        if width(columns, cells) + min(longest, 26) > console.width:
            columns, cells = cells_of(compact=True)
        table = Table(title="demoforge tasks", title_justify="left", box=None, pad_edge=False)
        # Every column but the segment summary keeps its full width: a name copied from here must work.
        for i, col in enumerate(columns):
            table.add_column(col, no_wrap=True, min_width=max([len(col)] + [len(c[i]) for c in cells]))
        table.add_column("segments", overflow="ellipsis", no_wrap=True)
        for c, r in zip(cells, rows):
            table.add_row(*c, _segment_summary(r["segments"]))
        console.print(table)  # wraps at the terminal width (soft wrap would overflow it)
        _console().print("details and options: demoforge tasks NAME")
    for failure in failures:
        _console(stderr=True).print(f"demoforge tasks: warning: {failure}", markup=False)
    return EXIT_OK


def _print_task(row: dict[str, Any], *, json_out: bool) -> int:
    if json_out:
        print(json.dumps(row, indent=2))
        return EXIT_OK
    console = _console()
    console.print(f"[bold]{row['name']}[/bold]: {row['description']}")
    console.print(f"fps {row['fps']}; action {tuple(row['action_shape'])}")
    for name, shape in row["cameras"].items():
        kind = "depth (float32 metres)" if row["camera_kinds"].get(name) == "depth" else "RGB"
        console.print(f"camera {name}: {shape[0]}x{shape[1]} {kind}")
    for name, shape in row["state_shapes"].items():
        console.print(f"state {name}: {tuple(shape)}", markup=False)
    segments = list(dict.fromkeys(row["segments"]))
    console.print(f"segments ({len(segments)}): " + " ".join(segments), markup=False)
    for key, value in row["options"].items():
        console.print(f"option {key} = {json.dumps(value)}  (--option {key}=...)", markup=False)
    return EXIT_OK


def _parse_options(items: Sequence[str]) -> dict[str, Any]:
    """``--option key=value``: values are JSON when they parse (numbers, booleans), else strings."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"demoforge: --option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


# ----------------------------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    """Execute episodes without storing them and print their segments (a quick look at a task)."""
    from demoforge.stages.executor import run_episodes
    from demoforge.stages.records import AttemptEnded
    from demoforge.pipeline.tasks.registry import get_task

    from demoforge.stages.records import EpisodeLayout

    entry = get_task(args.task)
    options = _parse_options(args.option)
    info = entry.info(options)
    layout = EpisodeLayout(max(1, len(info.suite)))
    env = entry.build(options)
    console = _console()
    each = f" of each of {layout.groups} tasks" if info.suite else ""
    table = Table(title=f"{args.task}: {args.episodes} episode(s){each}, seed {args.seed}")
    for col in ("episode", "attempt", "seed", "outcome", "frames", "segments (name [start,end) ok)"):
        table.add_column(col, overflow="fold")
    outcomes: Counter[str] = Counter()
    try:
        for record in run_episodes(env, task=args.task, episodes=args.episodes, job_seed=args.seed,
                                   max_attempts=args.max_attempts, cameras=info.cameras, layout=layout):
            if isinstance(record, AttemptEnded):
                r = record.result
                outcomes["committable" if r.committable else r.terminal_reason.value] += 1
                segs = " ".join(f"{s.name}[{s.start_step},{s.end_step}){'' if s.success else '✗'}"
                                for s in r.segments)
                outcome = "success" if r.committable else (r.failure_reason or r.terminal_reason.value)
                label = f"{r.episode_index} {r.task}" if info.suite else str(r.episode_index)
                table.add_row(label, str(r.attempt), str(r.seed), outcome, str(r.length), segs)
    finally:
        env.close()
    console.print(table)
    console.print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())))
    return EXIT_OK if outcomes["committable"] else EXIT_FAIL


# ------------------------------------------------------------------------------------------ generate
def _executor_config(args: argparse.Namespace):
    from demoforge.pipeline.workers.config import ExecutorConfig

    return ExecutorConfig(kind=args.executor, workers=args.workers, ray_address=args.ray_address,
                          cpus_per_worker=args.cpus_per_worker, max_in_flight=args.max_in_flight,
                          start_timeout_s=args.start_timeout)


def _job_spec(args: argparse.Namespace):
    from demoforge.pipeline.job import JobSpec, VideoSettings

    video = VideoSettings(codec=args.codec, crf=args.crf, g=args.gop, encoder_threads=args.encoder_threads)
    # Remote workers are counted by the executor's config (up to 1024); env threads by the job (up to 64).
    threads = args.workers if args.executor == "thread" else 1
    return JobSpec(task=args.task, episodes=args.episodes, task_options=_parse_options(args.option),
                   seed=args.seed, max_attempts=args.max_attempts, workers=threads, num_envs=args.num_envs,
                   video=video, queue_frames=args.queue_frames, step_timeout_s=args.step_timeout or None,
                   max_consecutive_abandoned=args.max_consecutive_abandoned)


def cmd_generate(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from demoforge.pipeline.runner import JobRunner, JobStats

    import anyio

    executor = _executor_config(args)
    spec = _job_spec(args)
    console = _console(stderr=True)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                        disable=not console.is_terminal)
    last_line = [0.0]
    finished_tasks: set[str] = set()

    def on_progress(stats: JobStats) -> None:
        target = stats.target
        detail = (f"discarded {sum(stats.discarded.values())}  {stats.frames_per_s():.0f} frames/s  "
                  f"queues {stats.queue_depths()}")
        if stats.per_task:  # a suite: the task being worked on, and a line for each task as it completes
            working = next((t for t, n in stats.per_task.items() if n < stats.per_task_target), None)
            if working is not None:
                detail = f"{working} {stats.per_task[working]}/{stats.per_task_target}  {detail}"
            for task, count in stats.per_task.items():
                if count >= stats.per_task_target and task not in finished_tasks:
                    finished_tasks.add(task)
                    console.print(f"{task}: {count}/{stats.per_task_target} committed", markup=False)
        progress.update(bar, completed=min(stats.total_committed, target), detail=detail)
        if not console.is_terminal:
            import time
            if time.monotonic() - last_line[0] > 5 or stats.total_committed >= target:
                last_line[0] = time.monotonic()
                console.print(f"committed {stats.total_committed}/{target}  {detail}", markup=False)

    on_outcome = None
    if args.json_logs:  # one JSON line per commit, on stderr, once the episode is durable
        from demoforge.pipeline.daemon import EventLog

        events = EventLog(True)

        def on_outcome(item) -> None:
            if item.ended.result.committable:
                events.emit("episode_committed", episode=item.ended.key.episode_id,
                            index=item.ended.key.episode_index, frames=item.ended.frames)

    runner = JobRunner(spec, args.store, on_progress, on_outcome=on_outcome, executor=executor,
                       on_event=lambda line: console.print(line, markup=False, highlight=False))
    if runner.info.suite:
        console.print(f"{spec.task}: {len(runner.info.suite)} tasks x {spec.episodes} episode(s) = {runner.target}",
                      markup=False)
    bar = progress.add_task(f"{spec.task}", total=runner.target, detail="")
    with progress:
        progress.update(bar, completed=0)
        report = anyio.run(lambda: runner.run(handle_signals=True))
    out = _console()
    out.print(report.recovery.describe())
    discarded = ", ".join(f"{k}={v}" for k, v in sorted(report.discarded.items())) or "none"
    ended = "stopped" if report.interrupted or report.runaway else "done"
    out.print(f"{ended}: {report.committed_total}/{report.target} episodes "
              f"committed in {args.store} ({report.committed_this_run} this run, {report.frames_this_run} frames, "
              f"{report.frames_this_run / max(report.elapsed_s, 1e-9):.0f} frames/s, {report.elapsed_s:.1f} s); "
              f"discarded attempts: {discarded}; abandoned episodes: {report.abandoned}{_workers_note(report)}")
    for task in report.per_task:  # a suite: the tasks that did not reach their target, or lost episodes
        if task.committed < spec.episodes or task.abandoned:
            out.print(f"  {task.task}: {task.committed}/{spec.episodes} committed"
                      + (f", {task.abandoned} episode(s) abandoned (all {spec.max_attempts} attempts failed, "
                         "--max-attempts)" if task.abandoned else "")
                      + (", given up: too many abandoned in a row" if task.runaway else ""), markup=False)
    given_up = [t for t in report.per_task if t.runaway is not None]
    if given_up:
        _console(stderr=True).print(
            f"demoforge generate: error: gave up {len(given_up)} task(s) of the suite; "
            + "; ".join(f"{t.task}: {t.runaway.describe()}" for t in given_up if t.runaway)
            + f". The {report.committed_total} committed episode(s) are kept; fix the task(s) (try `demoforge run "
            f"--task {given_up[0].task}`), then re-run the same command to resume.", markup=False)
        return EXIT_FAIL
    if report.runaway is not None:
        _console(stderr=True).print(f"demoforge generate: error: stopped because {report.runaway.describe()}. "
                                    f"The {report.committed_total} committed episode(s) are kept; fix the task "
                                    "(try `demoforge run` to watch a few episodes), then re-run the same command "
                                    "to resume.", markup=False)
        return EXIT_FAIL
    if not report.complete:
        out.print(f"re-run the same command to resume: {report.target - report.committed_total} episode(s) to go")
    elif args.export is not None:
        return _export_in_child(args.store, args.export, args.repo_id, args.export_timeout)
    return EXIT_OK if report.complete or report.interrupted else EXIT_FAIL


def _workers_note(report: Any) -> str:
    """Remote workers at the end of the run, when some were lost or the cluster had no room for all."""
    count = report.workers
    if count is None or (count.lost == 0 and count.running == count.wanted):
        return ""
    return f"; workers lost: {count.lost}, {count.running} of {count.wanted} running at the end"


def _export_in_child(store: Path, out: Path, repo_id: str | None, progress_timeout_s: float) -> int:
    """``generate --export``: the export runs as a watched child process (its memory is returned when it ends;
    one that stops making progress is ended, pipeline/export_child.py). Its own output is shown as it comes."""
    import anyio

    from demoforge.pipeline.export_child import export_in_child

    outcome = anyio.run(lambda: export_in_child(store, out, repo_id, progress_timeout_s=progress_timeout_s,
                                                capture_output=False))
    err = _console(stderr=True)
    retry = f"run `demoforge export --store {store} --out {out}` to retry"
    if outcome.stalled is not None:
        where = f"; its threads' stacks are in {outcome.stacks}" if outcome.stacks else ""
        if outcome.ok:
            report = outcome.report or {}
            _console().print(f"exported {report.get('exported')} episode(s) to {out} (version {report.get('version')}); "
                             f"the dataset now holds {report.get('total_episodes')} episodes. The export process was "
                             f"ended because {outcome.stalled}{where}", markup=False)
            return EXIT_OK
        err.print(f"demoforge generate: error: the export was ended because {outcome.stalled}{where}. The dataset "
                  f"{out} stays at its last published version and the store is intact; {retry} (--export-timeout "
                  "sets how long an export may go without progress)", markup=False)
        return EXIT_FAIL
    if outcome.returncode < 0:
        err.print(f"demoforge generate: error: the export process was {outcome.exit_text()}; the dataset {out} "
                  f"stays at its last published version and the store is intact; {retry}", markup=False)
        return EXIT_FAIL
    return outcome.returncode


# -------------------------------------------------------------------------------------------- status
def cmd_status(args: argparse.Namespace) -> int:
    from demoforge.storage.reader import open_store_reader

    with open_store_reader(args.store) as store:
        summary = store.catalog.summary()
        fingerprint = store.fingerprint
        summary["fingerprint"] = fingerprint.to_dict() if fingerprint is not None else None
        summary["store"] = str(args.store)
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    console = _console()
    fp = summary["fingerprint"] or {}
    console.print(f"store {args.store}: task {fp.get('task')!r}, fps {fp.get('fps')}, "
                  f"codec {fp.get('video', {}).get('codec')}, seed {fp.get('seed')}")
    states = summary["attempts_by_state"]
    console.print("attempts: " + (", ".join(f"{k}={v}" for k, v in sorted(states.items())) or "none"))
    console.print(f"committed frames: {summary['committed_frames']}")
    for task, by_state in summary.get("attempts_by_task", {}).items():
        done = by_state.get("committed", 0) + by_state.get("exported", 0)
        console.print(f"  {task}: {done} committed" + "".join(f", {n} {state}" for state, n in sorted(by_state.items())
                                                              if state not in ("committed", "exported")), markup=False)
    if summary.get("pruned"):
        console.print(f"pruned: {summary['pruned']} exported episode(s) hold no staged data any more "
                      "(`demoforge prune`); the dataset has them")
    reasons = summary["discarded_by_reason"]
    console.print("discarded by reason: " + (", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "none"))
    cleaned = Counter(r["action"] for r in summary["recovery"])
    console.print("recovery cleaned: " + (", ".join(f"{k}={v}" for k, v in sorted(cleaned.items())) or "nothing"))
    return EXIT_OK


# -------------------------------------------------------------------------------------------- export
def _report_fields(report: Any) -> dict[str, Any]:  # an ExportReport as the one JSON line of `export --json`
    return {"dataset": str(report.dataset), "version": report.version, "exported": report.exported,
            "total_episodes": report.total_episodes, "total_frames": report.total_frames,
            "quarantined": report.quarantined, "reconciled": report.reconciled,
            "pruned_elsewhere": list(report.pruned_elsewhere), "removed_by_edit": len(report.removed_by_edit),
            "elapsed_s": round(report.elapsed_s, 3)}


def _export(stores: list[Path], out: Path, repo_id: str | None, json_report: bool = False,
            channel: Any = None) -> int:
    """``channel``: a watching parent's (pipeline/export_child.py ``ChildChannel``), told of every step."""
    from demoforge.pipeline.faults import export_pause
    from demoforge.storage.lerobot.export import export_stores

    console = _console(stderr=True)
    fault = export_pause()

    def step(name: str) -> None:  # tests pause or hang an export at its steps
        if channel is not None:
            channel.event("step", step=name)
        if fault is not None:
            fault(name)

    def progress(done: int, total: int) -> None:
        if channel is not None:
            channel.event("episode", done=done, total=total)
        if console.is_terminal or done == total or done % 50 == 0:
            console.print(f"exported {done}/{total}")

    report = export_stores(stores, out, repo_id=repo_id, stage_pause=step, progress=progress,
                          on_published=None if channel is None else
                          lambda r: channel.event("published", **_report_fields(r)))
    if channel is not None:
        channel.event("report", **_report_fields(report))
    if json_report:  # one line, for scripts (a watched export child also reports on its channel)
        print(json.dumps(_report_fields(report)))
        step("after_report")
        return EXIT_OK
    out_console = _console()
    if report.pruned_elsewhere:
        out_console.print(f"{len(report.pruned_elsewhere)} episode(s) are not in {out} and cannot be exported: their "
                          "staged data was pruned after an export to another dataset")
    if report.removed_by_edit:
        out_console.print(f"{len(report.removed_by_edit)} episode(s) of these stores were removed from {out} by "
                          "`demoforge edit` and are not exported again")
    if report.quarantined:
        out_console.print(f"quarantined {len(report.quarantined)} corrupt episode(s), not exported: "
                          f"{', '.join(report.quarantined)} (see `demoforge verify --store STORE`)")
    if report.exported:
        out_console.print(f"exported {report.exported} episode(s) to {out} (version {report.version}); the dataset "
                          f"now holds {report.total_episodes} episodes, {report.total_frames} frames "
                          f"({report.elapsed_s:.1f} s)")
    else:
        out_console.print(f"nothing new to export; {out} holds {report.total_episodes} episodes, "
                          f"{report.total_frames} frames")
    step("after_report")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from demoforge.pipeline.export_child import ChildChannel

    channel = ChildChannel.from_environment()  # only when started as a daemon's (or generate's) export child
    code = _export(args.store, args.out, args.repo_id, json_report=args.json, channel=channel)
    if channel is not None:
        channel.exit(code)  # a finished child leaves at once (pipeline/export_child.py says why)
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.validate import describe, validate_dataset

    report = validate_dataset(args.dataset, expect_segments=args.expect_segments, video_backend=args.video_backend)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _console().print(describe(report), markup=False)
    return report.status


def cmd_inspect(args: argparse.Namespace) -> int:
    from demoforge.storage.inspect import describe, draw, inspect_path

    try:
        result = inspect_path(args.path, with_frames=args.plot is not None)
    except OSError as exc:  # missing, or a name the OS refuses (too long, not a directory)
        _console(stderr=True).print(f"demoforge inspect: error: {exc}", markup=False)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _console().print(describe(result), markup=False)
    if args.plot is not None:
        _console(stderr=True).print(f"wrote {draw(result, args.plot)}")
    return EXIT_OK


def cmd_view(args: argparse.Namespace) -> int:
    from demoforge.storage.viewer.command import run_view

    return run_view(args.path, host=args.host, port=args.port, html=args.html)


# ---------------------------------------------------------------------------------------- edit, merge
def _edit_progress(console: Console):
    def show(what: str, done: int, total: int) -> None:
        if console.is_terminal or done == total:
            console.print(f"{what}: {done}/{total}", markup=False)
    return show


def cmd_edit(args: argparse.Namespace) -> int:
    from demoforge.pipeline.faults import export_pause
    from demoforge.storage.lerobot.edit_selection import parse_split, read_replay_report
    from demoforge.storage.lerobot.edit_source import EditError, open_dataset
    from demoforge.storage.lerobot.episode_filter import FilterError, parse_filter
    from demoforge.storage.lerobot.edit import edit_dataset

    if not (args.delete or args.delete_rejected or args.keep_where or args.task or args.split or args.out):
        raise EditError("say what to change: --delete, --delete-rejected, --keep-where, --task, or --split / --out "
                        "(see `demoforge edit --help`)")
    if args.stratify is not None and args.split is None:
        raise EditError("--stratify is for --split")
    try:
        keep_where = parse_filter(args.keep_where) if args.keep_where is not None else None
    except FilterError as exc:
        raise EditError(f"{exc}\nfields:\n{_filter_fields()}") from None
    replay = read_replay_report(args.replay_report, open_dataset(args.dataset)) if args.replay_report else None
    report = edit_dataset(args.dataset, delete=args.delete, delete_rejected=args.delete_rejected,
                          keep_where=keep_where, task=args.task, replay=replay, out=args.out,
                          split=parse_split(args.split) if args.split else None, seed=args.seed,
                          stratify=args.stratify, out_root=args.out_root, repo_id=args.repo_id, dry_run=args.dry_run,
                          again=args.again, progress=_edit_progress(_console(stderr=True)), stage_pause=export_pause())
    return _print_edit(report, args, "edit")


def cmd_merge(args: argparse.Namespace) -> int:
    from demoforge.pipeline.faults import export_pause
    from demoforge.storage.lerobot.edit import merge_datasets

    report = merge_datasets(args.datasets, args.out, repo_id=args.repo_id, dry_run=args.dry_run,
                            progress=_edit_progress(_console(stderr=True)), stage_pause=export_pause())
    return _print_edit(report, args, "merge")


def _filter_fields() -> str:
    from demoforge.storage.lerobot.episode_filter import describe_fields

    return describe_fields()


def _print_edit(report: Any, args: argparse.Namespace, command: str) -> int:
    from demoforge.storage.lerobot.edit import ALREADY, DRY_RUN, UNCHANGED

    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return EXIT_OK
    console = _console()
    removed = ", ".join(f"{n} {reason}" for reason, n in report.removed.items())
    console.print(f"{command}: {' + '.join(report.sources)}: {report.source_episodes} episode(s)"
                  + (f"; removed {removed}" if removed else ""), markup=False)
    for o in report.outputs:
        what = f"{o.name}: " if o.name else ""
        shape = f"{o.episodes} episode(s), {o.frames} frames, {o.tasks} task(s)"
        if o.status == UNCHANGED:
            console.print(f"{what}nothing to change: {o.dataset} stays at version {o.version} ({shape})", markup=False)
            continue
        if o.status == ALREADY:
            console.print(f"{what}{o.dataset} (version {o.version}) already holds this edit's result ({shape}); "
                          "nothing was changed", markup=False)
            continue
        verb = "would write" if o.status == DRY_RUN else "wrote"
        version = f" version {o.version}" if o.version else ""
        console.print(f"{what}{verb} {o.dataset}{version}: {shape}; video: {o.video_files_copied} file(s) "
                      f"stream-copied, {o.video_files_linked} hard-linked; {o.reencoded_frames} frame(s) re-encoded"
                      + (f" (smart cut: {o.reencoded_episodes} episode(s) do not start on a keyframe)"
                         if o.reencoded_frames else ""), markup=False)
    for note in report.notes:
        console.print(note, markup=False)
    tail = "dry run: nothing was written" if any(o.status == DRY_RUN for o in report.outputs) else \
        f"done in {report.elapsed_s:.1f} s"
    console.print(tail, markup=False)
    return EXIT_OK


# -------------------------------------------------------------------------------------------- daemon
def cmd_daemon(args: argparse.Namespace) -> int:
    import anyio

    from demoforge.pipeline.daemon import EventLog, GenerationDaemon
    from demoforge.pipeline.daemon_config import load_config

    overrides: dict[str, Any] = {}
    if args.store is not None:
        overrides["store.dir"] = str(args.store.resolve())
    if args.export is not None:
        overrides["export.dir"] = str(args.export.resolve())
    if args.episodes is not None:
        overrides["job.episodes"] = args.episodes
    if args.metrics_address is not None:
        overrides["metrics.address"] = args.metrics_address
    if args.json_logs:
        overrides["log.json"] = True
    config = load_config(args.config, overrides)
    daemon = GenerationDaemon(config, EventLog(config.json_logs))
    return anyio.run(daemon.run)


# -------------------------------------------------------------------------------------------- verify
def cmd_verify(args: argparse.Namespace) -> int:
    if (args.dataset is None) == (args.store is None):
        raise SystemExit("demoforge verify: give a DATASET to check, or --store STORE (one of them)")
    if args.dataset is not None:
        return _verify_dataset(args)
    from demoforge.storage.reader import open_store_reader, open_store_updater
    from demoforge.storage.store_verify import verify_store

    quarantine = not args.no_quarantine  # quarantining writes states: only then is the store opened to update
    with (open_store_updater if quarantine else open_store_reader)(args.store) as store:
        _fingerprint, staging = store.require_job()
        report = verify_store(store.catalog, staging, quarantine=quarantine)
    if args.json:
        print(json.dumps({"checked": report.checked, "ok": report.ok, "quarantined": report.quarantined,
                          "pruned": report.pruned,
                          "problems": [{"episode_id": p.episode_id, "problem": p.problem} for p in report.problems]},
                         indent=2))
    else:
        console = _console()
        for p in report.problems:
            console.print(f"[red]BAD[/red] {p.episode_id}: {p.problem}")
        verdict = "all good" if report.ok else f"{len(report.problems)} bad, {len(report.quarantined)} quarantined"
        skipped = f" ({report.pruned} pruned after export, not re-read)" if report.pruned else ""
        console.print(f"verified {report.checked} committed episode(s) in {args.store}{skipped}: {verdict}")
    return EXIT_OK if report.ok else EXIT_FAIL


# --------------------------------------------------------------------------------------------- prune
def cmd_prune(args: argparse.Namespace) -> int:
    from demoforge.storage.catalog import Catalog
    from demoforge.storage.errors import StoreError
    from demoforge.storage.prune import prune_exported
    from demoforge.storage.reader import open_store_reader
    from demoforge.storage.staging import EpisodeLayout, StagingStore
    from demoforge.storage.store import acquire_lock
    from demoforge.storage.write_errors import human_bytes

    if not args.exported:
        raise StoreError("say what to prune: --exported (the staged data of episodes already exported)")
    with open_store_reader(args.store) as view:  # refuses what is not a store, before taking its lock
        view.require_job()
    lock_fd = acquire_lock(args.store)  # no generate or daemon may run meanwhile (the daemon has its own option)
    try:
        catalog = Catalog(args.store)  # the writer's opener (we hold the lock): adds the pruned table if missing
        try:
            fingerprint = catalog.fingerprint()
            if fingerprint is None:
                raise StoreError(f"{args.store} has no job fingerprint; nothing was ever generated there")
            staging = StagingStore(args.store, EpisodeLayout.from_fingerprint(fingerprint))
            console = _console(stderr=True)
            try:
                report = prune_exported(catalog, staging, progress=lambda done, total: console.print(
                    f"pruned {done}/{total}") if done == total or done % 500 == 0 else None)
            finally:
                staging.close()
        finally:
            catalog.close()
    finally:
        os.close(lock_fd)
    finished = f" (and finished {report.finished} an interrupted prune had started)" if report.finished else ""
    _console().print(f"pruned the staged data of {report.pruned} exported episode(s){finished} in {args.store}, "
                     f"freeing {human_bytes(report.freed_bytes)}; their catalog rows are kept; "
                     f"{report.kept_committed} committed episode(s) not yet exported were kept")
    return EXIT_OK


def _verify_dataset(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.file_checksums import verify_dataset

    report = verify_dataset(args.dataset)
    if args.json:
        print(json.dumps({"dataset": str(report.dataset), "version": report.version, "checked": report.checked,
                          "decoded_frames": report.decoded_frames, "ok": report.ok,
                          "problems": [{"path": p.path, "problem": p.problem} for p in report.problems]}, indent=2))
    else:
        console = _console()
        for p in report.problems:
            console.print(f"BAD {args.dataset / p.path}: {p.problem}", markup=False)
        verdict = "all good" if report.ok else f"{len(report.problems)} problem(s)"
        console.print(f"verified {report.checked} file(s) of {args.dataset} (version {report.version}) against "
                      f"their export checksums and decoded {report.decoded_frames} sampled frame(s): {verdict}",
                      markup=False)
    return EXIT_OK if report.ok else EXIT_FAIL


# -------------------------------------------------------------------------------------------- replay
def cmd_replay(args: argparse.Namespace) -> int:
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from demoforge.pipeline.replay import ReplaySettings
    from demoforge.pipeline.replay_run import print_report, run_replay

    settings = ReplaySettings(atol=args.atol, rtol=args.rtol, images=args.images, min_psnr_db=args.min_psnr)
    console = _console(stderr=True)
    progress = Progress(TextColumn("[bold]replay"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                        TimeElapsedColumn(), console=console, disable=not console.is_terminal or args.json)
    bar = progress.add_task("replay", total=None, detail="")
    last_line = [time.monotonic()]
    tally = Counter[str]()

    def on_episode(done: int, total: int, verdict) -> None:
        tally[verdict.verdict] += 1
        detail = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        progress.update(bar, completed=done, total=total, detail=detail)
        if not console.is_terminal and not args.json and (time.monotonic() - last_line[0] > 5 or done == total):
            last_line[0] = time.monotonic()
            console.print(f"replayed {done}/{total}: {detail}")

    with progress:
        report = run_replay(args.path, episodes=args.episodes, sample=args.sample, settings=settings,
                            workers=args.workers, progress=on_episode)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report, _console())
    return report.exit_code


# ---------------------------------------------------------------------------------------------- main
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every optional option's help ends with its default; descriptions and examples keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or not action.option_strings:
            return action.help
        return super()._get_help_string(action)


#: The example each command's --help ends with (a test checks every command has one).
EXAMPLES = {
    "tasks": "demoforge tasks fetch-pick-place",
    "run": "demoforge run --task metaworld-pick-place-v3 --episodes 2 --option camera=none",
    "generate": "demoforge generate --task fetch-pick-place --episodes 10 --store runs/fetch --export runs/fetch-dataset",
    "export": "demoforge export --store runs/fetch --store runs/fetch-2cycles --out runs/fetch-dataset",
    "validate": "demoforge validate runs/fetch-dataset --expect-segments 15",
    "inspect": "demoforge inspect runs/fetch --plot runs/fetch.png",
    "status": "demoforge status --store runs/fetch",
    "daemon": "demoforge daemon --config docs/daemon.example.toml",
    "verify": "demoforge verify --store runs/fetch --no-quarantine   (or: demoforge verify runs/fetch-dataset)",
    "prune": "demoforge prune --store runs/fetch --exported",
    "view": "demoforge view runs/fetch-dataset --port 8765",
    "replay": "demoforge replay runs/fetch --sample 20 --workers 2 --images",
    "edit": "demoforge edit runs/fetch-dataset --delete 3,7,10-12 --keep-where 'length >= 50'   (or: --split "
            "train=0.9,val=0.1 --seed 0 --out-root runs/splits)",
    "merge": "demoforge merge runs/fetch-monday runs/fetch-tuesday --out runs/fetch-week",
}


def _finish_help(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """One formatter everywhere, and each command's help ends with its example."""
    parser.formatter_class = _HelpFormatter
    parser.epilog = (EXIT_STATUS_HELP + "\n\nexample:\n  " + EXAMPLES["generate"]
                     + "\n\nrun `demoforge COMMAND --help` for a command's options")
    for name, command in sub.choices.items():
        command.formatter_class = _HelpFormatter
        if name in EXAMPLES:
            command.epilog = "example:\n  " + EXAMPLES[name]


def build_parser() -> argparse.ArgumentParser:
    from demoforge.pipeline.export_child import DEFAULT_PROGRESS_TIMEOUT_S
    from demoforge.pipeline.job import DEFAULT_MAX_CONSECUTIVE_ABANDONED
    from demoforge.pipeline.tasks.registry import DEFAULT_TASK

    parser = argparse.ArgumentParser(
        prog="demoforge", description="Segment-aware, crash-proof robot demonstrations: generate episodes from "
        "gymnasium tasks with scripted experts into a resumable store, export them as LeRobot v3.0 datasets.")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, show the full Python traceback instead of the short message")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("tasks", help="list the tasks (built-in and plugins), or describe one")
    p.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help="describe this task in full: cameras, shapes, every segment, options (none: list all tasks)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(fn=cmd_tasks)

    def job_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--task", default=DEFAULT_TASK,
                       help="a task name (`demoforge tasks`), or package.module:factory for a task not installed")
        p.add_argument("--episodes", type=int, default=10,
                       help="episodes to commit (the job's target); for a suite such as metaworld-mt10, of each "
                            "of its tasks")
        p.add_argument("--seed", type=int, default=0,
                       help="job seed: each attempt's env seed is derived from (seed, episode, attempt)")
        p.add_argument("--max-attempts", type=int, default=3,
                       help="attempts per episode before it is abandoned (failed attempts are discarded)")
        p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a task option, e.g. --option cycles=2 (see `demoforge tasks`)")

    p = sub.add_parser("run", help="execute episodes without storing them; print each one's segments")
    job_args(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("generate", help="generate episodes into a store until N are committed (resumable)")
    job_args(p)
    p.add_argument("--store", type=Path, required=True,
                   help="the job's store folder (created if new; re-run with the same one to resume). Required")
    p.add_argument("--workers", type=int, default=1,
                   help="env workers: threads, processes or Ray actors, per --executor (remote executors: the "
                        "most that run at once; a Ray job carries on with fewer while the cluster lacks room)")
    p.add_argument("--executor", choices=["thread", "process", "ray"], default="thread",
                   help="where env workers run: threads in this process, worker processes on this machine, or "
                        "Ray actors (see docs/scale-out.md)")
    p.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                   help="join a running Ray cluster (HOST:PORT or auto; None: start a local Ray)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs Ray reserves for each actor")
    p.add_argument("--start-timeout", type=float, default=180.0, metavar="SECONDS",
                   help="process and Ray executors: stop with exit status 1 when no worker has been running for "
                        "this long (none could be placed, or all were lost and none replaced)")
    p.add_argument("--max-in-flight", type=int, default=4,
                   help="pieces (of up to 16 encoded frames) a remote worker may run ahead of the writer")
    p.add_argument("--num-envs", type=int, default=1, help="vector-env rows per worker")
    p.add_argument("--codec", default="libsvtav1", help="libsvtav1 (LeRobot's default), h264, hevc")
    p.add_argument("--crf", type=int, default=30, help="encoder quality (lower: better, larger)")
    p.add_argument("--gop", type=int, default=2, help="keyframe interval")
    p.add_argument("--encoder-threads", type=int, default=None,
                   help="threads per camera encoder (None: the codec decides)")
    p.add_argument("--queue-frames", type=int, default=32, help="capacity of each inter-stage queue")
    p.add_argument("--step-timeout", type=float, default=60.0,
                   help="seconds an env call may take before its attempt is aborted (0: no limit)")
    p.add_argument("--max-consecutive-abandoned", type=int, default=DEFAULT_MAX_CONSECUTIVE_ABANDONED,
                   metavar="K", help="stop with exit status 1 when the last K episodes were all abandoned (every "
                                     "attempt failed); 0: never")
    p.add_argument("--export", type=Path, default=None, metavar="DATASET_DIR",
                   help="when the target is reached, export to this LeRobot dataset")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the exported dataset")
    p.add_argument("--json-logs", action="store_true",
                   help="also print one JSON line per committed episode on stderr, once it is durable "
                        "(event episode_committed: episode, index, frames)")
    p.add_argument("--export-timeout", type=float, default=DEFAULT_PROGRESS_TIMEOUT_S, metavar="SECONDS",
                   help="end the export (--export) when it reports no progress for this long: it exits with "
                        "status 1 and the dataset keeps its last published version")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("export", help="write committed, not yet exported episodes into a LeRobot v3.0 dataset")
    p.add_argument("--store", type=Path, required=True, action="append",
                   help="a store to export from; repeat it to put several jobs with the same features into one "
                        "dataset (each job's instruction becomes a task). Required")
    p.add_argument("--out", type=Path, required=True, metavar="DATASET_DIR",
                   help="the dataset (a link to its published version; created if new). Required")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the dataset (None: demoforge/TASK)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line (what the daemon reads)")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("validate", help="check an exported dataset and load it with LeRobotDataset "
                                        "(exit 0 valid, 1 mismatch, 2 cannot load)")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR", help="an exported dataset")
    p.add_argument("--expect-segments", type=int, default=None,
                   help="every episode must have this many segments (None: not checked)")
    p.add_argument("--video-backend", default="pyav", choices=["pyav", "torchcodec"],
                   help="the video backend LeRobotDataset loads with")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser(
        "edit", help="delete, filter or split the episodes of a published dataset without re-encoding video "
                     "(atomic; a new version, or new datasets)",
        description="Choose episodes, then publish them losslessly (packets copied) and atomically: as the "
                    "dataset's next version (default), as a new dataset (--out), or as one dataset per part "
                    "(--split ... --out-root). Rules combine: an episode stays when no rule removes it.\n\n"
                    "--keep-where fields:\n" + _filter_fields())
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR",
                   help="a dataset written by `demoforge export`, or a LeRobot v3.0 dataset (then --out or --split: "
                        "demoforge never modifies a dataset it did not write)")
    p.add_argument("--delete", default=None, metavar="EPISODES",
                   help="episode indices and ranges to delete, e.g. 3,7,10-12 or 40- (None: none)")
    p.add_argument("--delete-rejected", action="store_true",
                   help="delete the episodes marked rejected in `demoforge view` (DATASET_DIR.rejected.json)")
    p.add_argument("--keep-where", default=None, metavar="EXPR",
                   help='keep only episodes matching EXPR, e.g. \'outcome == "success" and length >= 50\' '
                        "(fields above; None: all)")
    p.add_argument("--task", default=None, metavar="NAME",
                   help="keep only episodes of this task (a LeRobot task string or a demoforge task name; None: all)")
    p.add_argument("--replay-report", type=Path, default=None, metavar="FILE",
                   help="a `demoforge replay DATASET --json` report: gives --keep-where its `replay` field")
    p.add_argument("--split", default=None, metavar="NAME=FRACTION,...",
                   help="split the kept episodes into datasets --out-root/NAME, e.g. train=0.9,val=0.1 (None: no "
                        "split; the dataset itself is not changed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split's deterministic shuffle")
    p.add_argument("--stratify", choices=["task"], default=None,
                   help="split each task in the given proportions on its own (None: the whole dataset at once)")
    p.add_argument("--out-root", type=Path, default=None, metavar="DIR", help="where --split writes its parts")
    p.add_argument("--out", type=Path, default=None, metavar="NEW_DATASET_DIR",
                   help="write the result as a new dataset instead of a new version (None: a new version)")
    p.add_argument("--repo-id", default=None, help="repo id recorded in what is written (None: the source's)")
    p.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    p.add_argument("--again", action="store_true",
                   help="apply the edit even when the published version is already its result (a re-run after a "
                        "crash reports that instead, so an edit is never applied twice by accident)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_edit)

    p = sub.add_parser("merge", help="merge datasets with the same features into a new one, without re-encoding "
                                     "video (tasks united, indices renumbered; atomic)")
    p.add_argument("datasets", type=Path, nargs="+", metavar="DATASET_DIR",
                   help="two or more datasets, in the order their episodes go into the new one")
    p.add_argument("--out", type=Path, required=True, metavar="NEW_DATASET_DIR",
                   help="the new dataset (must not exist yet, or be this merge's result). Required")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the new dataset (None: the first's)")
    p.add_argument("--dry-run", action="store_true", help="check the features and print what would be written")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_merge)

    p = sub.add_parser("inspect", help="episodes, outcomes and segment statistics of a store or dataset")
    p.add_argument("path", type=Path, metavar="STORE_OR_DATASET", help="a store folder or an exported dataset")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="draw segment timelines and a contact sheet of frames at segment boundaries")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("view", help="watch episodes in the browser: videos, segment timeline, curves; mark a "
                                    "dataset's episodes rejected (the dataset is never written)",
                       description="Serve a local page (loopback by default) for a store or dataset, or write it as "
                                   "a folder that opens from disk (--html). Then open http://127.0.0.1:8765/.")
    p.add_argument("path", type=Path, metavar="STORE_OR_DATASET",
                   help="a store (generate --store) or an exported dataset (export --out); a dataset is pinned to "
                        "the version published when the viewer starts")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; another address prints a warning)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0 picks a free one)")
    p.add_argument("--html", type=Path, default=None, metavar="OUT_DIR",
                   help="write the page as a static folder that opens from disk instead of serving it "
                        "(None: serve)")
    p.set_defaults(fn=cmd_view)

    p = sub.add_parser("status", help="counts by state and outcome of a store (safe while a job runs)")
    p.add_argument("--store", type=Path, required=True, help="the store folder. Required")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=cmd_status)

    p = sub.add_parser("daemon", help="run generation as a service: periodic export, metrics, graceful stop")
    p.add_argument("--config", type=Path, required=True, metavar="JOB.toml",
                   help="the job file (docs/daemon.md). Required")
    p.add_argument("--store", type=Path, default=None, help="override store.dir")
    p.add_argument("--export", type=Path, default=None, help="override export.dir")
    p.add_argument("--episodes", type=int, default=None, help="override job.episodes")
    p.add_argument("--metrics-address", default=None, metavar="HOST:PORT", help="override metrics.address")
    p.add_argument("--json-logs", action="store_true", help="structured JSON log lines")
    p.set_defaults(fn=cmd_daemon)

    p = sub.add_parser("verify", help="re-read a store's committed episodes (--store) or a published dataset's "
                                      "files against their export checksums (DATASET); exit 0 good, 1 problems",
)
    p.add_argument("dataset", type=Path, nargs="?", default=None, metavar="DATASET",
                   help="an exported dataset: changed, missing or extra files by path, sampled frames decoded")
    p.add_argument("--store", type=Path, default=None, help="a store: checksums, counts, hashes, video frames")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-quarantine", action="store_true", help="report only; do not quarantine bad episodes")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("prune", help="delete the staged data of episodes already exported (keeps catalog rows)")
    p.add_argument("--store", type=Path, required=True, help="the store folder. Required")
    p.add_argument("--exported", action="store_true",
                   help="prune every exported episode: the dataset holds it, export never needs it again "
                        "(must be given)")
    p.set_defaults(fn=cmd_prune)


    p = sub.add_parser(
        "replay", help="re-simulate episodes from their seeds and actions and compare every recorded frame "
                       "(exit 0 all reproduced, 1 any diverged, 2 cannot run)",
    )
    p.add_argument("path", type=Path, metavar="STORE_OR_DATASET",
                   help="a store (its committed episodes) or a dataset written by `demoforge export`")
    p.add_argument("--episodes", default=None, metavar="SPEC",
                   help="episode numbers, e.g. 0-9,12,40- (a store's job episode index, a dataset's episode "
                        "index; None: all)")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="replay N of the selected episodes, picked by a fixed hash of their number (the same N "
                        "every time; None: all)")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance for states and rewards (None: the task's, see docs/reliability.md)")
    p.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for states and rewards (None: the task's)")
    p.add_argument("--images", action="store_true",
                   help="also compare every re-rendered camera frame with the stored video: RGB by PSNR, depth "
                        "cameras' 12-bit codes exactly")
    p.add_argument("--min-psnr", type=float, default=None, metavar="DB",
                   help="lowest PSNR a stored frame may have with --images (None: the codec's threshold)")
    p.add_argument("--workers", type=int, default=1, help="episodes replayed in parallel worker processes")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(fn=cmd_replay)
    for command in sub.choices.values():  # `demoforge generate ... --debug` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error (default: off)")
    _finish_help(parser, sub)
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors a person can act on (bad input, a refused store): one line, exit 2. Imported when an error
    happens, so that a command does not load every other command's modules at start-up."""
    from demoforge.pipeline.daemon_config import DaemonConfigError
    from demoforge.pipeline.job import JobConfigError
    from demoforge.pipeline.replay_run import ReplayInputError
    from demoforge.pipeline.tasks.registry import TaskDefinitionError, TaskOptionError, UnknownTaskError
    from demoforge.pipeline.workers.config import ExecutorError
    from demoforge.storage.catalog import JobMismatchError
    from demoforge.storage.errors import StoreError
    from demoforge.storage.lerobot.export import ExportError
    from demoforge.storage.staging import StagingFormatError
    from demoforge.storage.viewer.files import ViewerError

    return (JobConfigError, TaskOptionError, TaskDefinitionError, UnknownTaskError, JobMismatchError, StoreError,
            ExportError, DaemonConfigError, ViewerError, ReplayInputError, ExecutorError, StagingFormatError)


def main(argv: Sequence[str] | None = None) -> int:
    from demoforge.pipeline.environment import prepare_process
    from demoforge.stages.malloc import limit_malloc_arenas, make_uninitialized_reads_deterministic
    from demoforge.pipeline.error_report import EXIT_WRITE_FAILED, describe_write_failure
    from demoforge.pipeline.workers.config import WorkersLostError
    from demoforge.storage.write_errors import is_write_error

    args = build_parser().parse_args(argv)
    prepare_process()
    limit_malloc_arenas()
    make_uninitialized_reads_deterministic()
    err = _console(stderr=True)
    try:
        try:
            return args.fn(args)
        except BaseExceptionGroup as group:  # errors raised inside a task group arrive wrapped
            if args.debug:
                raise
            leaves = _leaves(group)
            known = _known_errors() + (WorkersLostError,)
            if leaves and all(isinstance(e, known) for e in leaves):
                raise leaves[0] from None
            # The first real failure; the others are usually its consequences (a closed stream, a cancel).
            first = next((e for e in leaves if is_write_error(e)), None) or next(
                (e for e in leaves if isinstance(e, Exception)), None)
            if first is not None:
                raise first from None
            raise
    except KeyboardInterrupt:
        err.print(f"demoforge {args.command}: stopped at once; committed episodes are kept")
        return 130
    except Exception as exc:
        if isinstance(exc, WorkersLostError):
            err.print(f"demoforge {args.command}: error: {exc}", markup=False)
            return EXIT_FAIL
        if args.debug:
            raise
        if isinstance(exc, _known_errors()):
            err.print(f"demoforge {args.command}: error: {exc}", markup=False)
            return EXIT_USAGE
        if is_write_error(exc):
            err.print(describe_write_failure(args.command, exc, args), markup=False)
            return EXIT_WRITE_FAILED
        err.print(f"demoforge {args.command}: internal error: {type(exc).__name__}: {exc}\n"
                  "  committed data is safe (it is durable before it counts)\n"
                  "  add --debug for the traceback, and report it", markup=False)
        return EXIT_FAIL


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


if __name__ == "__main__":
    sys.exit(main())
