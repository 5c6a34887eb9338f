"""What every command module shares: exit codes, the console, the help formatter, and the job options that
``run`` and ``generate`` both take."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from demoforge.pipeline.tasks.registry import DEFAULT_TASK

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def make_console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every optional option's help ends with its default; descriptions and examples keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or not action.option_strings:
            return action.help
        return super()._get_help_string(action)


def add_command(sub: argparse._SubParsersAction, name: str, *, example: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser, with the one formatter and the example its help ends with (a test checks every
    command has one); ``kwargs`` go to ``add_parser`` (help, description)."""
    return sub.add_parser(name, formatter_class=HelpFormatter, epilog="example:\n  " + example, **kwargs)


def add_job_options(p: argparse.ArgumentParser) -> None:
    """The options that say which episodes a job makes (``run`` and ``generate``)."""
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


def parse_options(items: Sequence[str]) -> dict[str, Any]:
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
