"""``demoforge daemon``: generation as a service (a job file, periodic export, metrics, graceful stop)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from demoforge.pipeline.cli.common import add_command

# Imported where used: the daemon (it loads the job runner, zarr and PyAV) and its job-file reader, which
# `demoforge --help` need not load.


def add_daemon_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "daemon", help="run generation (or, with a [multiply] section, a multiply job) as a service: "
                                        "periodic export, metrics, graceful stop",
                    example="demoforge daemon --config docs/daemon.example.toml")
    p.add_argument("--config", type=Path, required=True, metavar="JOB.toml",
                   help="the job file (docs/daemon.md). Required")
    p.add_argument("--store", type=Path, default=None, help="override store.dir")
    p.add_argument("--export", type=Path, default=None, help="override export.dir")
    p.add_argument("--episodes", type=int, default=None, help="override job.episodes")
    p.add_argument("--metrics-address", default=None, metavar="HOST:PORT", help="override metrics.address")
    p.add_argument("--json-logs", action="store_true", help="structured JSON log lines")
    p.set_defaults(fn=cmd_daemon)


def cmd_daemon(args: argparse.Namespace) -> int:
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
    import anyio  # here: `demoforge --help` and the store commands need none of it

    return anyio.run(daemon.run)

