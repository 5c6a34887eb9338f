"""``demoforge repair``: a LeRobot v3.0 dataset that LeRobot's writer left broken by a crash, loadable again."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from demoforge.pipeline.cli.common import EXIT_FAIL, EXIT_OK, add_command, make_console

# Imported where used: the repair (pyarrow, lerobot's metadata writer), which `demoforge --help` need not load.


def add_repair_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "repair", help="recover the episodes a crashed LeRobot recording saved: rebuild the "
                                        "data files' footers, the episode metadata, info and statistics, and "
                                        "publish a dataset that loads (exit 0 written or healthy, 1 nothing "
                                        "recoverable, 2 not a dataset repair understands)",
                    example="demoforge repair runs/pick --out runs/pick-repaired")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR",
                   help="the LeRobot v3.0 dataset a killed `lerobot-record` (or LeRobotDataset loop) left behind")
    p.add_argument("--out", type=Path, default=None, metavar="NEW_DATASET_DIR",
                   help="where the repaired dataset is published (default: DATASET_DIR-repaired); must not exist")
    p.add_argument("--in-place", action="store_true",
                   help="replace DATASET_DIR by the repaired dataset; the broken one is kept beside it as "
                        "NAME.broken-TIME")
    p.add_argument("--encode-pngs", action="store_true",
                   help="encode episodes whose frames are only PNG folders (LeRobot's batch encoding had not run) "
                        "instead of dropping them")
    p.add_argument("--vcodec", default=None,
                   help="codec for --encode-pngs, one LeRobot's encoder takes (h264, hevc, libsvtav1, ...; checked "
                        "before anything is read; default: the one info.json records, else LeRobot's default "
                        "libsvtav1)")
    p.add_argument("--dry-run", action="store_true", help="report what would be recovered and lost; write nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=cmd_repair)


def cmd_repair(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.repair import repair_dataset

    report = repair_dataset(args.dataset, args.out, in_place=args.in_place, dry_run=args.dry_run,
                            encode_pngs=args.encode_pngs, vcodec=args.vcodec)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        console = make_console()
        for line in report.findings:
            console.print(f"found: {line}", highlight=False, markup=False)
        for episode in report.lost:
            frames = "length unknown" if episode.frames is None else f"{episode.frames} frames"
            console.print(f"lost: episode {episode.episode_index} ({frames}): {episode.reason}",
                          highlight=False, markup=False)
        total = len(report.episodes)
        if report.healthy:
            console.print(f"{args.dataset}: healthy ({total} episodes, every file whole and every count right); "
                          "nothing to repair, nothing written", highlight=False, markup=False)
        elif report.out is None:
            what = "would recover" if args.dry_run else "recovered"
            console.print(f"{args.dataset}: {what} {report.recovered} of {total} episode(s)"
                          + ("; nothing written (--dry-run)" if args.dry_run else "; nothing written"),
                          highlight=False, markup=False)
        else:
            renumbered = sum(1 for e in report.episodes if e.recovered and e.new_index != e.episode_index)
            console.print(f"recovered {report.recovered} of {total} episode(s) into {report.out}"
                          + (f", {len(report.lost)} lost (named above)" if report.lost else "")
                          + (f" ({renumbered} renumbered after the lost ones)" if renumbered else "")
                          + (f"; the broken dataset is kept at {report.backup}" if report.backup else "")
                          + f" ({report.elapsed_s:.1f} s)", highlight=False, markup=False)
    if not report.healthy and report.recovered == 0:
        return EXIT_FAIL
    return EXIT_OK
