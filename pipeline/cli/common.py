"""What every command module shares: exit codes, the console, the help formatter, and the job options that
``run`` and ``generate`` both take."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:  # imported when a job runs: `demoforge --help` needs none of it
    from rich.progress import Progress

from demoforge.pipeline.tasks.randomization import AXES
from demoforge.pipeline.tasks.registry import DEFAULT_TASK, TaskOptionError
from demoforge.stages.settings import SUPPORTED_CODECS

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def make_console(stderr: bool = False) -> Console:
    """The console every command prints through. User text (paths, task names, option values, error messages that
    quote them) is printed literally: no markup (``[red]`` stays text, a stray ``[/x]`` cannot raise) and no emoji
    codes (``gap:-1:3`` is not a thumbs-down). Styling is explicit: a :class:`rich.text.Text` with a style."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False, emoji=False)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every optional option's help ends with its default in one style, ``(default: VALUE)``: ``off``/``on`` for a
    flag, ``none`` for an option that is unset unless given; descriptions and examples keep their line breaks.

    A help that names its default in words already ("(default: the task's)") keeps them and gets no second one.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.required or not action.option_strings or action.default is argparse.SUPPRESS
                or NAMES_DEFAULT.search(text)):
            return action.help
        return f"{text} (default: {default_words(action)})"


def default_words(action: argparse.Action) -> str:
    """An option's default as its help says it (escaped for argparse's %-formatting of help strings)."""
    if action.nargs == 0 and isinstance(action.const, bool):  # store_true / store_false
        return "on" if action.default else "off"
    if action.default is None or action.default == []:
        return "none"
    return str(action.default).replace("%", "%%")


NAMES_DEFAULT = re.compile(r"\bdefault:", re.IGNORECASE)


def add_command(sub: argparse._SubParsersAction, name: str, *, example: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser, with the one formatter and the example its help ends with (a test checks every
    command has one); ``kwargs`` go to ``add_parser`` (help, description)."""
    return sub.add_parser(name, formatter_class=HelpFormatter, epilog="example:\n  " + example, **kwargs)


def job_progress(console: Console) -> Progress:
    """The bar a job shows on a terminal (generate, multiply, rerender): description, bar, count, a detail field,
    time; disabled elsewhere, where the command prints a line now and then instead. User text is not markup."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[detail]}", markup=False), TimeElapsedColumn(), console=console,
                    disable=not console.is_terminal)


def add_job_options(p: argparse.ArgumentParser) -> None:
    """The options that say which episodes a job makes (``run`` and ``generate``)."""
    p.add_argument("--task", default=DEFAULT_TASK,
                   help="a task name (`demoforge tasks`), or package.module:factory for a task not installed")
    p.add_argument("--episodes", type=int, default=10,
                   help="how many episodes: generate commits this many to the store (the job's target), run "
                        "executes and shows them and stores nothing; for a suite such as metaworld-mt10, of each "
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
                        "sub-task rows (default: the task's own instruction)")


def add_codec_option(p: argparse.ArgumentParser) -> None:
    """The cameras' codec, one of those the job's settings accept (stages/settings.py)."""
    p.add_argument("--codec", default="libsvtav1", choices=SUPPORTED_CODECS,
                   help="the cameras' video codec: libsvtav1 (AV1, LeRobot's default), libaom-av1 (AV1, slower), "
                        "h264 or hevc")


#: Every axis a job may randomize; rerender may redraw only a scene's looks (physics and the start state are the
#: episode's own there, pipeline/rerender.py).
JOB_AXES, APPEARANCE_AXES = "lighting, colors, camera, physics, init", "lighting, colors, camera"


def add_randomize_option(p: argparse.ArgumentParser, axes: str = JOB_AXES) -> None:
    p.add_argument("--randomize", default=None, metavar="AXES",
                   help=f"redraw the scene before every attempt, from its seed: comma-separated axes among {axes} "
                        "(or all the task supports); ranges are task options such as "
                        "--option randomize.camera.pos=0.03 (see `demoforge tasks NAME`); the drawn values are "
                        "recorded with each episode (default: off, the task's own scene)")


def task_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--option`` items, with ``--randomize`` as the task option ``randomize``."""
    options = parse_options(args.option)
    if getattr(args, "randomize", None) is not None:
        if "randomize" in options:
            raise TaskOptionError("give the axes once: --randomize or --option randomize=..., not both")
        if not args.randomize.strip():
            raise TaskOptionError(f"--randomize {args.randomize!r}: name one or more axes ({', '.join(AXES)}, or "
                                  "all), or leave the option out")
        options["randomize"] = args.randomize
    if getattr(args, "instructions", None) is not None:
        from demoforge.pipeline.tasks.instructions import (
            INSTRUCTIONS,
            InstructionsError,
            canonical,
            parse_table,
            read_table_file,
        )

        if INSTRUCTIONS in options:
            raise TaskOptionError("give the phrasings once: --instructions or --option instructions=..., not both")
        try:
            options[INSTRUCTIONS] = canonical(parse_table(read_table_file(args.instructions)))
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
    p.add_argument("--beta", type=float, default=None,
                   help="with --driver: the probability that the expert's action is executed instead of the "
                        "policy's, drawn each step (DAgger's mixture; default: 0)")
    p.add_argument("--takeover", default=None, metavar="RULE",
                   help="with --driver: gap:BOUND:STEPS: the expert takes over after STEPS steps in a row where "
                        "the policy's action differs from its own by more than BOUND, until its phase advances; "
                        "those frames are marked intervention (default: none)")
    p.add_argument("--policy-timeout", type=float, default=None, metavar="SECONDS",
                   help="with --driver: seconds one call of the policy may take; a call that takes longer fails "
                        "its attempt (naming the driver) and the policy is built again for the next one; below "
                        "--step-timeout; 0: no limit (default: 30, or half a shorter --step-timeout)")


def control_spec(args: argparse.Namespace) -> Any:
    """The job's :class:`~demoforge.stages.control.ControlSpec` from the control options (default: the expert
    drives alone); a malformed one is a JobConfigError naming its option."""
    from demoforge.stages.control import (
        DEFAULT_POLICY_TIMEOUT_S,
        ControlError,
        ControlSpec,
        parse_noise,
        parse_takeover,
    )
    from demoforge.stages.settings import JobConfigError
    from demoforge.pipeline.flags import control_message

    policy_only = {"--beta": args.beta, "--takeover": args.takeover, "--policy-timeout": args.policy_timeout}
    if args.noise is None and args.driver is None and all(v is None for v in policy_only.values()):
        return None
    if args.driver is None:  # given at all, even empty or 0: these options only mean something with a policy
        for option, value in policy_only.items():
            if value is not None:
                raise JobConfigError(f"{option} {value!r}: --beta and --takeover need --driver (a policy to mix "
                                     "with or take over from); --policy-timeout limits the calls of a --driver")
    if args.driver is not None and not args.driver.strip():
        raise JobConfigError("--driver '': name a LeRobot checkpoint folder or module:factory")
    timeout = args.policy_timeout
    if timeout is None:  # the default, kept below a shorter env watchdog (--step-timeout)
        watchdog = getattr(args, "step_timeout", None)
        timeout = DEFAULT_POLICY_TIMEOUT_S
        if watchdog and watchdog > 0:
            timeout = min(timeout, watchdog / 2)
    if not timeout >= 0:  # NaN too
        raise JobConfigError(f"--policy-timeout must be >= 0 seconds (0: no limit), got {timeout}")
    try:
        return ControlSpec(noise=parse_noise(args.noise) if args.noise is not None else None, driver=args.driver,
                           beta=args.beta or 0.0,
                           takeover=parse_takeover(args.takeover) if args.takeover is not None else None,
                           policy_timeout_s=timeout or None)
    except ControlError as exc:
        raise JobConfigError(control_message(exc)) from None


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
