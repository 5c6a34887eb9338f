"""``demoforge replay``: re-simulate episodes from their seeds and actions and compare every recorded frame."""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from demoforge.pipeline.cli.common import add_command, make_console

# Imported where used: replay itself (simulators, PyAV) and rich's progress bar, which `demoforge --help` need
# not load.


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "replay", help="re-simulate episodes from their seeds and actions and compare every "
                                        "recorded frame (exit 0 all reproduced, 1 any diverged, 2 cannot run)",
                    example="demoforge replay runs/fetch --sample 20 --workers 2 --images")
    p.add_argument("path", type=Path, metavar="STORE_OR_DATASET",
                   help="a store (its committed episodes) or a dataset written by `demoforge export`")
    p.add_argument("--episodes", default=None, metavar="SPEC",
                   help="episode numbers, e.g. 0-9,12,40- (a store's job episode index, a dataset's episode "
                        "index; default: all)")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="replay N of the selected episodes, picked by a fixed hash of their number (the same N "
                        "every time; default: all)")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance for states and rewards (default: the task's, see docs/reliability.md)")
    p.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for states and rewards (default: the task's)")
    p.add_argument("--images", action="store_true",
                   help="also compare every re-rendered camera frame with the stored video: RGB by PSNR, depth "
                        "cameras' 12-bit codes exactly")
    p.add_argument("--min-psnr", type=float, default=None, metavar="DB",
                   help="lowest PSNR a stored frame may have with --images (default: the codec's threshold)")
    p.add_argument("--workers", type=int, default=1, help="episodes replayed in parallel worker processes")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(fn=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from demoforge.pipeline.replay import ReplaySettings
    from demoforge.pipeline.replay_run import print_report, run_replay

    settings = ReplaySettings(atol=args.atol, rtol=args.rtol, images=args.images, min_psnr_db=args.min_psnr)
    console = make_console(stderr=True)
    progress = Progress(TextColumn("[bold]replay"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                        disable=not console.is_terminal or args.json)
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
        print_report(report, make_console())
    return report.exit_code
