"""``demoforge view``: watch a store's or dataset's episodes in the browser, or write the page as a folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from demoforge.pipeline.cli.common import add_command

# Imported where used: the viewer's server and page sources (numpy, PyAV decoding), which `demoforge --help`
# need not load.


def add_view_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "view", help="watch episodes in the browser: videos, segment timeline, curves; mark a "
                                      "dataset's episodes rejected (the dataset is never written)",
                    description="Serve a local page (loopback by default) for a store or dataset and print the "
                                "address to open (http://HOST:PORT/ with the port it listens on), or write the page "
                                "as a folder that opens from disk (--html) and print the file to open.",
                    example="demoforge view runs/fetch-dataset --port 8765")
    p.add_argument("path", type=Path, metavar="STORE_OR_DATASET",
                   help="a store (generate --store) or an exported dataset (export --out); a dataset is pinned to "
                        "the version published when the viewer starts")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; another address prints a warning)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0 picks a free one)")
    p.add_argument("--html", type=Path, default=None, metavar="OUT_DIR",
                   help="write the page as a static folder that opens from disk instead of serving it "
                        "(default: serve)")
    p.set_defaults(fn=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from demoforge.pipeline.viewer.command import run_view

    return run_view(args.path, host=args.host, port=args.port, html=args.html)
