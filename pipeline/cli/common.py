"""What every command module shares: exit codes, the console, the help formatter, and the job options that
``run`` and ``generate`` both take."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from demoforge.pipeline.tasks.registry import DEFAULT_TASK, TaskOptionError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def make_console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every optional option's help ends with its default; descriptions and examples keep their line breaks.

    A help that already names its default in words ("default: none", "Default: off") keeps them and gets no
    second, raw one (``(default: None)`` after ``default: none`` told a reader nothing).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or not action.option_strings or NAMES_DEFAULT.search(action.help or ""):
            return action.help
        return super()._get_help_string(action)


NAMES_DEFAULT = re.compile(r"\bdefault:", re.IGNORECASE)


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
    add_randomize_option(p)
    p.add_argument("--instructions", type=Path, default=None, metavar="FILE",
                   help='phrasings to draw from, per episode, by its seed: a JSON file {"task": [...], '
                        '"segments": {"NAME": [...]}} (docs/diversity.md); recorded as the episode\'s task and '
                        "sub-task rows. Default: the task's own instruction")


def add_randomize_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--randomize", default=None, metavar="AXES",
                   help="redraw the scene before every attempt, from its seed: comma-separated axes among "
                        "lighting, colors, camera, physics, init (or all the task supports); ranges are task "
                        "options such as --option randomize.camera.pos=0.03 (see `demoforge tasks NAME`); "
                        "the drawn values are recorded with each episode. Default: off (the task's own scene)")


def task_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--option`` items, with ``--randomize`` as the task option ``randomize``."""
    options = parse_options(args.option)
    if getattr(args, "randomize", None) is not None:
        if "randomize" in options:
            raise TaskOptionError("give the axes once: --randomize or --option randomize=..., not both")
        options["randomize"] = args.randomize
    if getattr(args, "instructions", None) is not None:
        from demoforge.pipeline.tasks.instructions import INSTRUCTIONS, InstructionsError, canonical, parse_table

        if INSTRUCTIONS in options:
            raise TaskOptionError("give the phrasings once: --instructions or --option instructions=..., not both")
        try:
            text = Path(args.instructions).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TaskOptionError(f"--instructions {args.instructions}: cannot read it: {exc}") from None
        try:
            options[INSTRUCTIONS] = canonical(parse_table(text))
        except InstructionsError as exc:
            raise TaskOptionError(f"--instructions {args.instructions}: {exc}") from None
    return options


def add_control_options(p: argparse.ArgumentParser, *, driver_required: bool = False) -> None:
    """Who drives the episodes (stages/control.py): noise on the expert's actions, or a policy it labels."""
    p.add_argument("--noise", default=None, metavar="SPEC",
                   help="execute the expert's action plus gaussian noise and record the clean action as the "
                        "label: gaussian:SCALE, gaussian:S1,S2,... (one per action dimension), optionally "
                        "@SEGMENT[+SEGMENT] to noise only those segments; seeded by each attempt's seed "
                        "(default: none)")
    p.add_argument("--driver", default=None, required=driver_required, metavar="PATH_OR_SPEC",
                   help="a policy drives and the expert labels every state it visits: a LeRobot checkpoint "
                        "folder (pretrained_model) or module:factory" + (" (required)" if driver_required
                                                                         else " (default: the expert drives)"))
    p.add_argument("--beta", type=float, default=0.0,
                   help="with --driver: the probability that the expert's action is executed instead of the "
                        "policy's, drawn each step (DAgger's mixture; default: 0)")
    p.add_argument("--takeover", default=None, metavar="RULE",
                   help="with --driver: gap:BOUND:STEPS: the expert takes over after STEPS steps in a row where "
                        "the policy's action differs from its own by more than BOUND, until its phase advances; "
                        "those frames are marked intervention (default: none)")


def control_spec(args: argparse.Namespace) -> Any:
    """The job's :class:`~demoforge.stages.control.ControlSpec` from the control options (None: the expert
    drives alone); a malformed one is a JobConfigError naming its option."""
    from demoforge.stages.control import ControlError, ControlSpec, parse_noise, parse_takeover
    from demoforge.stages.settings import JobConfigError

    if args.noise is None and args.driver is None and not args.beta and args.takeover is None:
        return None
    try:
        return ControlSpec(noise=parse_noise(args.noise) if args.noise is not None else None, driver=args.driver,
                           beta=args.beta, takeover=parse_takeover(args.takeover) if args.takeover else None)
    except ControlError as exc:
        raise JobConfigError(str(exc)) from None


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """``--option key=value``: values are JSON when they parse (numbers, booleans), else strings."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise TaskOptionError(f"--option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options
