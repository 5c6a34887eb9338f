"""``demoforge tasks`` (list or describe the tasks) and ``demoforge run`` (execute a few episodes without
storing them): a look at a task before a job."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from demoforge.pipeline.cli.common import EXIT_FAIL, EXIT_OK, add_command, add_job_options, make_console, task_options
from demoforge.pipeline.tasks.randomization import RANDOMIZE, RANGES
from demoforge.pipeline.tasks.registry import TaskDefinitionError, get_task, plugin_failures, task_names
from demoforge.stages.records import AttemptEnded, EpisodeLayout

# Imported where used: the executor (gymnasium's env machinery), which `demoforge --help` need not load.


def add_tasks_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "tasks", help="list the tasks (built-in and plugins), or describe one",
                    example="demoforge tasks fetch-pick-place")
    p.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help="describe this task in full: cameras, shapes, every segment, options (none: list all tasks)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(fn=cmd_tasks)


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "run", help="execute episodes without storing them; print each one's segments",
                    example="demoforge run --task metaworld-pick-place-v3 --episodes 2 --option camera=none")
    add_job_options(p)
    p.set_defaults(fn=cmd_run)


def _task_row(name: str) -> dict[str, Any]:
    entry = get_task(name)
    info = entry.info()
    return {"name": name, "description": info.description, "fps": info.fps,
            "cameras": {c.name: list(c.shape) for c in info.cameras},
            "camera_kinds": {c.name: c.kind for c in info.cameras},
            "action_shape": list(info.action_shape),
            "state_shapes": {k: list(v) for k, v in info.state_shapes.items()},
            "segments": list(info.segment_names), "labels_any_state": info.labels_any_state,
            "options": entry.resolve_options(),  # every option (the fingerprint leaves some defaults out)
            "randomization_axes": list(entry.randomization.axes()) if entry.randomization is not None else []}


def _segment_summary(names: Sequence[str]) -> str:
    """``15 (reach_0 ... release_2)``: a count that never makes the table wrap; full list with ``tasks NAME``."""
    unique = list(dict.fromkeys(names))
    if len(unique) <= 2:
        return f"{len(unique)} ({' '.join(unique)})"
    return f"{len(unique)} ({unique[0]} ... {unique[-1]})"


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.name:
        return _print_task(_task_row(args.name), json_out=args.json)
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
            cams = [(_sizes(r["cameras"]) if compact else ", ".join(f"{k} {v[0]}x{v[1]}" for k, v in r["cameras"].items()))
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
        make_console().print("details and options: demoforge tasks NAME")
    for failure in failures:
        make_console(stderr=True).print(f"demoforge tasks: warning: {failure}", markup=False)
    return EXIT_OK


def _sizes(cameras: dict[str, Any]) -> str:
    """A narrow terminal's camera cell: one camera's size, or how many cameras (`tasks NAME` has their sizes)."""
    if len(cameras) == 1:
        (shape,) = cameras.values()
        return f"{shape[0]}x{shape[1]}"
    return f"{len(cameras)} cams" if cameras else ""


def entry_limit(task: str, key: str) -> float:
    """The largest value ``task`` accepts for randomization option ``key``."""
    scene = get_task(task).randomization
    return scene.limit(key) if scene is not None else RANGES[key].limit


def _print_task(row: dict[str, Any], *, json_out: bool) -> int:
    if json_out:
        print(json.dumps(row, indent=2))
        return EXIT_OK
    console = make_console()
    console.print(f"[bold]{row['name']}[/bold]: {row['description']}")
    console.print(f"fps {row['fps']}; action {tuple(row['action_shape'])}")
    for name, shape in row["cameras"].items():
        kind = "depth (float32 metres)" if row["camera_kinds"].get(name) == "depth" else "RGB"
        console.print(f"camera {name}: {shape[0]}x{shape[1]} {kind}")
    for name, shape in row["state_shapes"].items():
        console.print(f"state {name}: {tuple(shape)}", markup=False)
    console.print("expert: labels any state (--noise, --driver and eval allowed)" if row["labels_any_state"] else
                  "expert: plans ahead, cannot label states it did not choose (--noise and --driver refused)",
                  markup=False)
    segments = list(dict.fromkeys(row["segments"]))
    console.print(f"segments ({len(segments)}): " + " ".join(segments), markup=False)
    axes = row["randomization_axes"]
    console.print(f"randomization: --randomize {','.join(axes)} (any of them)" if axes else
                  "randomization: none (the task declares no scene to vary)", markup=False)
    for key, value in row["options"].items():
        if key.startswith(RANDOMIZE + ".") and key.split(".")[1] not in axes:
            continue
        meaning = f"  {RANGES[key].help}, at most {entry_limit(row['name'], key):g}" if key in RANGES else ""
        console.print(f"option {key} = {json.dumps(value)}  (--option {key}=...){meaning}", markup=False)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Execute episodes without storing them and print their segments (a quick look at a task)."""
    from demoforge.stages.executor import run_episodes

    entry = get_task(args.task)
    options = task_options(args)
    info = entry.info(options)
    layout = EpisodeLayout(max(1, len(info.suite)))
    env = entry.build(options)
    console = make_console()
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
