"""``demoforge edit`` (delete, filter, split or trim a published dataset's episodes) and ``demoforge merge``
(datasets into a new one): lossless and atomic, video packets copied."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from demoforge.pipeline.cli.common import EXIT_OK, add_command, make_console
from demoforge.storage.lerobot.episode_filter import FilterError, describe_fields, parse_filter

# Imported where used: the editor and its dataset reader (they load zarr, PyAV and pyarrow), which
# `demoforge --help` need not load.


def add_edit_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "edit", help="delete, filter, split or trim the episodes of a published dataset without re-encoding "
                          "video (atomic; a new version, or new datasets)",
        description="Choose episodes, then publish them losslessly (packets copied) and atomically: as the "
                    "dataset's next version (default), as a new dataset (--out), or as one dataset per part "
                    "(--split ... --out-root). Rules combine: an episode stays when no rule removes it. --trim "
                    "drops frames at the ends of episodes instead (only those up to a keyframe re-encoded).\n\n"
                    "--keep-where fields:\n" + describe_fields(),
        example="demoforge edit runs/fetch-dataset --delete 3,7 --keep-where 'length >= 50' --dry-run")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR",
                   help="a dataset written by `demoforge export`, or a LeRobot v3.0 dataset (then --out or --split: "
                        "demoforge never modifies a dataset it did not write)")
    p.add_argument("--delete", default=None, metavar="EPISODES",
                   help="episode indices and ranges to delete, e.g. 3,7,10-12 or 40- (default: none)")
    p.add_argument("--delete-rejected", action="store_true",
                   help="delete the episodes marked rejected in `demoforge view` (DATASET_DIR.rejected.json)")
    p.add_argument("--keep-where", default=None, metavar="EXPR",
                   help='keep only episodes matching EXPR, e.g. \'outcome == "success" and length >= 50\' '
                        "(fields above; default: all)")
    p.add_argument("--trim", default=None, metavar="SPEC",
                   help="drop frames at each episode's start and end: start=N,end=M (frame counts; a segmented "
                        "episode is cut between segments) or segments=NAME+NAME (those segments at either end, e.g. "
                        "segments=idle+retreat); with --keep-where, only the episodes it matches are trimmed and the "
                        "others kept as they are (default: no trim)")
    p.add_argument("--task", default=None, metavar="NAME",
                   help="keep only episodes of this task (a LeRobot task string or a demoforge task name; default: all)")
    p.add_argument("--replay-report", type=Path, default=None, metavar="FILE",
                   help="a `demoforge replay DATASET --json` report: gives --keep-where its `replay` field")
    p.add_argument("--split", default=None, metavar="NAME=FRACTION,...",
                   help="split the kept episodes into datasets --out-root/NAME, e.g. train=0.9,val=0.1 (default: no "
                        "split; the dataset itself is not changed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split's deterministic shuffle")
    p.add_argument("--stratify", choices=["task"], default=None,
                   help="split each task in the given proportions on its own (default: the whole dataset at once)")
    p.add_argument("--out-root", type=Path, default=None, metavar="DIR", help="where --split writes its parts")
    p.add_argument("--out", type=Path, default=None, metavar="NEW_DATASET_DIR",
                   help="write the result as a new dataset instead of a new version (default: a new version)")
    p.add_argument("--repo-id", default=None, help="repo id recorded in what is written (default: the source's)")
    p.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    p.add_argument("--again", action="store_true",
                   help="apply the edit even when the published version is already its result (a re-run after a "
                        "crash reports that instead, so an edit is never applied twice by accident)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_edit)


def add_merge_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "merge", help="merge datasets with the same features into a new one, without re-encoding "
                                       "video (tasks united, indices renumbered; atomic)",
                    example="demoforge merge runs/fetch-monday runs/fetch-tuesday --out runs/fetch-week")
    p.add_argument("datasets", type=Path, nargs="+", metavar="DATASET_DIR",
                   help="two or more datasets, in the order their episodes go into the new one")
    p.add_argument("--out", type=Path, required=True, metavar="NEW_DATASET_DIR",
                   help="the new dataset (must not exist yet, or be this merge's result). Required")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the new dataset (default: the first's)")
    p.add_argument("--dry-run", action="store_true", help="check the features and print what would be written")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_merge)


def _edit_progress(console: Console) -> Callable[[str, int, int], None]:
    def show(what: str, done: int, total: int) -> None:
        if console.is_terminal or done == total:
            console.print(f"{what}: {done}/{total}", markup=False)
    return show


def cmd_edit(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.edit_selection import parse_split, read_replay_report
    from demoforge.storage.lerobot.edit_source import EditError, open_dataset
    from demoforge.storage.lerobot.edit_trim import parse_trim
    from demoforge.storage.lerobot.edit import EditOutputs, EditRules, edit_dataset

    if not (args.delete or args.delete_rejected or args.keep_where or args.task or args.split or args.out
            or args.trim):
        raise EditError("say what to change: --delete, --delete-rejected, --keep-where, --task, --trim, or --split / "
                        "--out (see `demoforge edit --help`)")
    trim = parse_trim(args.trim) if args.trim is not None else None
    if args.stratify is not None and args.split is None:
        raise EditError("--stratify is for --split")
    try:
        keep_where = parse_filter(args.keep_where) if args.keep_where is not None else None
    except FilterError as exc:
        raise EditError(f"{exc}\nfields:\n{describe_fields()}") from None
    replay = read_replay_report(args.replay_report, open_dataset(args.dataset)) if args.replay_report else None
    rules = EditRules(delete=args.delete, delete_rejected=args.delete_rejected, keep_where=keep_where,
                      task=args.task, replay=replay, trim=trim)
    outputs = EditOutputs(out=args.out, split=parse_split(args.split) if args.split else None,
                          out_root=args.out_root, seed=args.seed, stratify=args.stratify, repo_id=args.repo_id)
    report = edit_dataset(args.dataset, rules, outputs, dry_run=args.dry_run, again=args.again,
                          progress=_edit_progress(make_console(stderr=True)))
    return _print_edit(report, args, "edit")


def cmd_merge(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.edit import merge_datasets

    report = merge_datasets(args.datasets, args.out, repo_id=args.repo_id, dry_run=args.dry_run,
                            progress=_edit_progress(make_console(stderr=True)))
    return _print_edit(report, args, "merge")


def _print_edit(report: Any, args: argparse.Namespace, command: str) -> int:
    from demoforge.storage.lerobot.edit import ALREADY, DRY_RUN, UNCHANGED

    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return EXIT_OK
    console = make_console()
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
        if o.trimmed_episodes:
            console.print(f"{what}{'would trim' if o.status == DRY_RUN else 'trimmed'} {o.trimmed_episodes} "
                          f"episode(s): {o.trimmed_frames} frame(s) dropped", markup=False)
    for note in report.notes:
        console.print(note, markup=False)
    tail = "dry run: nothing was written" if any(o.status == DRY_RUN for o in report.outputs) else \
        f"done in {report.elapsed_s:.1f} s"
    console.print(tail, markup=False)
    return EXIT_OK


