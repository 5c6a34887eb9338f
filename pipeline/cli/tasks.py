"""``demoforge tasks`` (list or describe the tasks) and ``demoforge run`` (execute a few episodes without
storing them): a look at a task before a job."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

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
            "randomization_axes": list(entry.randomization.axes()) if entry.randomization is not None else [],
            "suite": list(info.suite)}  # a suite's member tasks ([] for a task)


def _segment_summary(names: Sequence[str]) -> str:
    """``15 (reach_0 ... release_2)``: a count that stays short; the full list with ``tasks NAME``."""
    unique = list(dict.fromkeys(names))
    if len(unique) <= 2:
        return f"{len(unique)} ({' '.join(unique)})"
    return f"{len(unique)} ({unique[0]} ... {unique[-1]})"


#: The narrowest description column beside a row; narrower, the description goes on the lines under it.
MIN_DESCRIPTION = 30
#: How far a line under a row (its description, or a stacked row's details) is indented.
INDENT = 4
GAP = "  "  # between columns: a camera cell has one space inside


def short_description(row: Mapping[str, Any]) -> str:
    """One line about a task: its description without parenthesised asides, up to the first ``;``; a suite
    says how many tasks it runs (``tasks NAME`` names them all)."""
    members = row.get("suite") or []
    if members:
        return f"{len(members)} tasks: " + ", ".join(members[:3]) + (", ..." if len(members) > 3 else "")
    text = str(row["description"])
    while (shorter := re.sub(r" \([^()]*\)", "", text)) != text:
        text = shorter
    return " ".join(text.split(";", 1)[0].split()).rstrip(".")


def _wrap(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters, broken at spaces only (a word longer than a line keeps its line)."""
    return textwrap.wrap(text, max(width, 1), break_long_words=False, break_on_hyphens=False) or [""]


def _camera_cells(row: Mapping[str, Any]) -> list[str]:
    return [f"{name} {shape[0]}x{shape[1]}" for name, shape in row["cameras"].items()] or ["-"]


def _join(cells: Sequence[Sequence[str]], widths: Sequence[int]) -> list[str]:
    """Cells of several lines side by side, each column padded to its width; no line ends in spaces."""
    height = max(len(c) for c in cells)
    lines = []
    for i in range(height):
        parts = [(c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths)]
        lines.append(GAP.join(parts).rstrip())
    return lines


def task_table(rows: Sequence[Mapping[str, Any]], width: int) -> list[str]:
    """The listing as lines that fit ``width`` columns where the names allow: tasks, then suites; name, fps,
    cameras, action and a short description beside (or, narrow, under) each; the segments when wide enough;
    every line stacked (name, then details) when even the columns do not fit. Names are never cut."""
    tasks = [r for r in rows if not r.get("suite")]
    suites = [r for r in rows if r.get("suite")]
    cells = {r["name"]: {"fps": [str(r["fps"])], "action": [str(tuple(r["action_shape"]))],
                         "segments": [_segment_summary(r["segments"])], "cameras": [", ".join(_camera_cells(r))]}
             for r in rows}
    name_w = max([len("task")] + [len(r["name"]) for r in rows])

    def widths(columns: Sequence[str]) -> list[int]:
        return [name_w] + [max([len(col)] + [len(line) for c in cells.values() for line in c[col]])
                           for col in columns]

    columns = ["fps", "cameras", "action"]
    if sum(widths(columns)) + len(GAP) * len(columns) + MIN_DESCRIPTION > width:
        for r in rows:  # one camera per line
            cells[r["name"]]["cameras"] = _camera_cells(r)
    fixed = sum(widths(columns)) + len(GAP) * len(columns)
    if fixed + len(GAP) + max((len(c["segments"][0]) for c in cells.values()), default=0) + 60 <= width:
        columns.append("segments")  # a wide terminal: the segment summary too
        fixed = sum(widths(columns)) + len(GAP) * len(columns)
    beside = width - fixed - len(GAP) >= MIN_DESCRIPTION

    def render(r: Mapping[str, Any]) -> list[str]:
        about = short_description(r)
        if fixed > width:  # not even the columns fit: the name, then its details under it
            details = f"{r['fps']} fps; cameras {', '.join(_camera_cells(r))}; action {tuple(r['action_shape'])}"
            return [r["name"]] + [" " * INDENT + line for text in (details, about)
                                  for line in _wrap(text, width - INDENT)]
        row_cells = [[r["name"]]] + [cells[r["name"]][col] for col in columns]
        if beside:
            return _join(row_cells + [_wrap(about, width - fixed - len(GAP))], widths(columns) + [0])
        return _join(row_cells, widths(columns)) + [" " * INDENT + line for line in _wrap(about, width - INDENT)]

    heading = GAP.join(h.ljust(w) for h, w in zip(["task", *columns], widths(columns)))
    heading = (heading + GAP + "description" if beside else heading).rstrip()
    lines = ([heading] if fixed <= width else []) + [line for r in tasks for line in render(r)]
    if suites:
        lines += ["", *_wrap("suites: several tasks in one job and one store, --episodes N of each", width)]
        lines += [line for r in suites for line in render(r)]
    return lines


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
        width = shutil.get_terminal_size().columns
        for line in [*task_table(rows, width), *_wrap("details, options and a suite's tasks: demoforge tasks NAME",
                                                        width)]:
            print(line)
    for failure in failures:
        make_console(stderr=True).print(f"demoforge tasks: warning: {failure}", markup=False)
    return EXIT_OK


def entry_limit(task: str, key: str) -> float:
    """The largest value ``task`` accepts for randomization option ``key``."""
    scene = get_task(task).randomization
    return scene.limit(key) if scene is not None else RANGES[key].limit


def _print_task(row: dict[str, Any], *, json_out: bool) -> int:
    if json_out:
        print(json.dumps(row, indent=2))
        return EXIT_OK
    console = make_console()
    console.print(Text.assemble((row["name"], "bold"), f": {row['description']}"))
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
    if row["suite"]:
        console.print(f"suite of {len(row['suite'])} tasks, --episodes N of each in one store: "
                      + " ".join(row["suite"]))
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
                outcomes["succeeded" if r.committable else r.terminal_reason.value] += 1
                segs = " ".join(f"{s.name}[{s.start_step},{s.end_step}){'' if s.success else '✗'}"
                                for s in r.segments)
                outcome = "success" if r.committable else (r.failure_reason or r.terminal_reason.value)
                label = f"{r.episode_index} {r.task}" if info.suite else str(r.episode_index)
                table.add_row(label, str(r.attempt), str(r.seed), outcome, str(r.length), segs)
    finally:
        env.close()
    console.print(table)
    console.print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
                  + " (nothing was stored: `demoforge generate` records episodes)")
    return EXIT_OK if outcomes["succeeded"] else EXIT_FAIL
