"""Commands that read or tend a store (and its exported dataset): ``status``, ``inspect``, ``verify`` (a store's
episodes, or a dataset's files against their export checksums) and ``prune``."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from demoforge.pipeline.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_command, make_console
from demoforge.storage.errors import StoreError
from demoforge.storage.write_errors import human_bytes

# Imported where used: the store's reader and writer, its checks and the dataset checks (they load zarr, PyAV
# and SQLite's catalog), which `demoforge --help` need not load.


def add_inspect_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "inspect", help="episodes, outcomes and segment statistics of a store or dataset",
                    example="demoforge inspect runs/fetch --plot runs/fetch.png")
    p.add_argument("path", type=Path, metavar="STORE_OR_DATASET", help="a store folder or an exported dataset")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="draw segment timelines and a contact sheet of frames at segment boundaries")
    p.set_defaults(fn=cmd_inspect)


def add_status_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "status", help="counts by state and outcome of a store (safe while a job runs)",
                    example="demoforge status --store runs/fetch")
    p.add_argument("--store", type=Path, required=True, help="the store folder. Required")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=cmd_status)


def add_verify_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "verify", help="re-read a store's committed episodes (--store) or a published dataset's "
                                        "files against their export checksums (DATASET); exit 0 good, 1 problems",
                    example="demoforge verify runs/fetch-dataset")
    p.add_argument("dataset", type=Path, nargs="?", default=None, metavar="DATASET",
                   help="an exported dataset: changed, missing or extra files by path, sampled frames decoded")
    p.add_argument("--store", type=Path, default=None, help="a store: checksums, counts, hashes, video frames")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-quarantine", action="store_true", help="report only; do not quarantine bad episodes")
    p.set_defaults(fn=cmd_verify)


def add_prune_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "prune", help="delete the staged data of episodes already exported (keeps catalog rows)",
                    example="demoforge prune --store runs/fetch --exported")
    p.add_argument("--store", type=Path, required=True, help="the store folder. Required")
    p.add_argument("--exported", action="store_true",
                   help="prune every exported episode: the dataset holds it, export never needs it again "
                        "(must be given)")
    p.set_defaults(fn=cmd_prune)


def cmd_status(args: argparse.Namespace) -> int:
    from demoforge.storage.store import open_store

    with open_store(args.store) as store:
        summary = store.summary()
        fingerprint = store.fingerprint
        summary["fingerprint"] = fingerprint.to_dict() if fingerprint is not None else None
        summary["store"] = str(args.store)
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    console = make_console()
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
    if summary.get("failures_kept") or fp.get("keep_failures"):
        kept = ", ".join(f"{k}={v}" for k, v in sorted(summary["failures_kept_by_reason"].items())) or "none yet"
        console.print(f"failures kept as episodes: {summary['failures_kept']} ({kept}); not counted above, exported "
                      "with `demoforge export --include failures|all`", markup=False)
    reasons = summary["discarded_by_reason"]
    console.print("discarded by reason: " + (", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "none"))
    cleaned = Counter(r["action"] for r in summary["recovery"])
    console.print("recovery cleaned: " + (", ".join(f"{k}={v}" for k, v in sorted(cleaned.items())) or "nothing"))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from demoforge.storage.episode_source import EpisodeReadError, EpisodeSourceError
    from demoforge.storage.inspect import describe, draw, inspect_path

    try:
        result = inspect_path(args.path, with_frames=args.plot is not None)
    except (EpisodeSourceError, EpisodeReadError) as exc:  # a dataset whose frames --plot cannot read
        make_console(stderr=True).print(f"demoforge inspect: error: cannot read frames to plot: {exc}", markup=False)
        return EXIT_USAGE
    except OSError as exc:  # missing, or a name the OS refuses (too long, not a directory)
        make_console(stderr=True).print(f"demoforge inspect: error: {exc}", markup=False)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        make_console().print(describe(result), markup=False)
    if args.plot is not None:
        make_console(stderr=True).print(f"wrote {draw(result, args.plot)}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    if (args.dataset is None) == (args.store is None):
        raise SystemExit("demoforge verify: give a DATASET to check, or --store STORE (one of them)")
    if args.dataset is not None:
        return _verify_dataset(args)
    from demoforge.storage.store import open_store

    quarantine = not args.no_quarantine  # quarantining writes states: only then is the store opened to update
    with open_store(args.store, "r+" if quarantine else "r") as store:
        report = store.verify(quarantine=quarantine)
    if args.json:
        print(json.dumps({"checked": report.checked, "ok": report.ok, "quarantined": report.quarantined,
                          "pruned": report.pruned,
                          "problems": [{"episode_id": p.episode_id, "problem": p.problem} for p in report.problems]},
                         indent=2))
    else:
        from rich.text import Text

        console = make_console()
        for p in report.problems:
            console.print(Text.assemble(("BAD", "red"), f" {p.episode_id}: {p.problem}"))
        verdict = "all good" if report.ok else f"{len(report.problems)} bad, {len(report.quarantined)} quarantined"
        skipped = f" ({report.pruned} pruned after export, not re-read)" if report.pruned else ""
        console.print(f"verified {report.checked} committed episode(s) in {args.store}{skipped}: {verdict}")
    return EXIT_OK if report.ok else EXIT_FAIL


def _verify_dataset(args: argparse.Namespace) -> int:
    from demoforge.storage.lerobot.file_checksums import verify_dataset

    report = verify_dataset(args.dataset)
    if args.json:
        print(json.dumps({"dataset": str(report.dataset), "version": report.version, "checked": report.checked,
                          "decoded_frames": report.decoded_frames, "ok": report.ok,
                          "problems": [{"path": p.path, "problem": p.problem} for p in report.problems]}, indent=2))
    else:
        console = make_console()
        for p in report.problems:
            console.print(f"BAD {args.dataset / p.path}: {p.problem}", markup=False)
        verdict = "all good" if report.ok else f"{len(report.problems)} problem(s)"
        console.print(f"verified {report.checked} file(s) of {args.dataset} (version {report.version}) against "
                      f"their export checksums and decoded {report.decoded_frames} sampled frame(s): {verdict}",
                      markup=False)
    return EXIT_OK if report.ok else EXIT_FAIL


def cmd_prune(args: argparse.Namespace) -> int:
    from demoforge.storage.store import open_store

    if not args.exported:
        raise StoreError("say what to prune: --exported (the staged data of episodes already exported)")
    console = make_console(stderr=True)
    # The writer's lock: no generate or daemon may run meanwhile (the daemon has its own option).
    with open_store(args.store, "w") as store:
        report = store.prune_exported(progress=lambda done, total: console.print(
            f"pruned {done}/{total}") if done == total or done % 500 == 0 else None)
    finished = f" (and finished {report.finished} an interrupted prune had started)" if report.finished else ""
    make_console().print(f"pruned the staged data of {report.pruned} exported episode(s){finished} in {args.store}, "
                         f"freeing {human_bytes(report.freed_bytes)}; their catalog rows are kept; "
                         f"{report.kept_committed} committed episode(s) not yet exported were kept")
    return EXIT_OK
