"""``demoforge export`` (committed episodes into a LeRobot v3.0 dataset; also what a daemon's or generate's
watched export child runs) and ``demoforge validate`` (load an exported dataset with LeRobotDataset)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from demoforge.pipeline.cli.common import EXIT_OK, add_command, make_console
from demoforge.pipeline.export_child import ChildChannel
from demoforge.storage.faults import ExportStep, reach
from demoforge.storage.schema import INCLUDE_CHOICES

# Imported where used: the exporter and the validator (they load zarr, PyAV and LeRobot's readers), which
# `demoforge --help` need not load.


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export", help="write committed, not yet exported episodes into a LeRobot v3.0 dataset",
                    example="demoforge export --store runs/fetch --store runs/fetch-2cycles --out runs/fetch-dataset")
    p.add_argument("--store", type=Path, required=True, action="append",
                   help="a store to export from; repeat it to put several jobs with the same features into one "
                        "dataset (each job's instruction becomes a task). Required")
    p.add_argument("--out", type=Path, required=True, metavar="DATASET_DIR",
                   help="the dataset (a link to its published version; created if new). Required")
    p.add_argument("--repo-id", default=None, help="repo id recorded in the dataset (default: demoforge/TASK)")
    p.add_argument("--include", default="episodes", choices=INCLUDE_CHOICES,
                   help="which committed episodes: the job's episodes (each counted toward --episodes), the "
                        "failed attempts `generate --keep-failures` kept, or all (default: episodes)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line (what the daemon reads)")
    p.set_defaults(fn=cmd_export)


def add_validate_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "validate", help="check an exported dataset and load it with LeRobotDataset "
                                          "(exit 0 valid, 1 mismatch, 2 cannot load)",
                    example="demoforge validate runs/fetch-dataset --expect-segments 15")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR", help="an exported dataset")
    p.add_argument("--expect-segments", type=int, default=None,
                   help="every episode must have this many segments (default: not checked)")
    p.add_argument("--video-backend", default="pyav", choices=["pyav", "torchcodec"],
                   help="the video backend LeRobotDataset loads with")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_validate)


def _report_fields(report: Any) -> dict[str, Any]:  # an ExportReport as the one JSON line of `export --json`
    return {"dataset": str(report.dataset), "version": report.version, "exported": report.exported,
            "total_episodes": report.total_episodes, "total_frames": report.total_frames,
            "quarantined": report.quarantined, "reconciled": report.reconciled,
            "pruned_elsewhere": list(report.pruned_elsewhere), "removed_by_edit": len(report.removed_by_edit),
            "left_out": report.left_out, "elapsed_s": round(report.elapsed_s, 3)}


def _export(stores: list[Path], out: Path, repo_id: str | None, json_report: bool = False,
            channel: Any = None, include: str = "episodes") -> int:
    """``channel``: a watching parent's (pipeline/export_child.py ``ChildChannel``), told of every step."""
    from demoforge.storage.lerobot.export import export_stores

    console = make_console(stderr=True)

    def step(reached: ExportStep) -> None:  # a watching parent counts the steps as progress
        channel.event("step", step=reached.value)

    def progress(done: int, total: int) -> None:
        if channel is not None:
            channel.event("episode", done=done, total=total)
        if console.is_terminal or done == total or done % 50 == 0:
            console.print(f"exported {done}/{total}")

    on_step = step if channel is not None else None
    report = export_stores(stores, out, repo_id=repo_id, on_step=on_step, progress=progress,
                          on_published=None if channel is None else
                          lambda r: channel.event("published", **_report_fields(r)), include=include)
    if channel is not None:
        channel.event("report", **_report_fields(report))
    if json_report:  # one line, for scripts (a watched export child also reports on its channel)
        print(json.dumps(_report_fields(report)))
        reach(ExportStep.AFTER_REPORT, on_step)
        return EXIT_OK
    out_console = make_console()
    if report.pruned_elsewhere:
        out_console.print(f"{len(report.pruned_elsewhere)} episode(s) are not in {out} and cannot be exported: their "
                          "staged data was pruned after an export to another dataset")
    if report.removed_by_edit:
        out_console.print(f"{len(report.removed_by_edit)} episode(s) of these stores were removed from {out} by "
                          "`demoforge edit` and are not exported again")
    if report.quarantined:
        out_console.print(f"quarantined {len(report.quarantined)} corrupt episode(s), not exported: "
                          f"{', '.join(report.quarantined)} (see `demoforge verify --store STORE`)")
    if report.left_out:
        other = "kept failures" if include == "episodes" else "job episodes" if include == "failures" else "episodes"
        out_console.print(f"{report.left_out} committed episode(s) not exported: {other}, which --include {include} "
                          "leaves out (--include all takes every committed episode)")
    if report.exported:
        out_console.print(f"exported {report.exported} episode(s) to {out} (version {report.version}); the dataset "
                          f"now holds {report.total_episodes} episode(s), {report.total_frames} frames "
                          f"({report.elapsed_s:.1f} s)")
    else:
        out_console.print(f"nothing new to export; {out} holds {report.total_episodes} episode(s), "
                          f"{report.total_frames} frames")
    reach(ExportStep.AFTER_REPORT, on_step)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    channel = ChildChannel.from_environment()  # only when started as a daemon's (or generate's) export child
    code = _export(args.store, args.out, args.repo_id, json_report=args.json, channel=channel, include=args.include)
    if channel is not None:
        channel.exit(code)  # a finished child leaves at once (pipeline/export_child.py says why)
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.validate import describe, validate_dataset

    report = validate_dataset(args.dataset, expect_segments=args.expect_segments, video_backend=args.video_backend)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        make_console().print(describe(report), markup=False)
    return report.status

