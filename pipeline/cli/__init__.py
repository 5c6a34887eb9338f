"""The ``demoforge`` command line: the parser assembled from one module per command group (each owns its
commands' options and handlers), and ``main``, which turns an error into a few lines a person can act on."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from demoforge.pipeline.cli import (
    daemon,
    edit,
    evaluate,
    export,
    generate,
    repair,
    replay,
    rerender,
    store,
    tasks,
    view,
)
from demoforge.pipeline.cli.common import EXIT_FAIL, EXIT_USAGE, HelpFormatter, make_console
from demoforge.pipeline.environment import prepare_process
from demoforge.pipeline.error_report import EXIT_WRITE_FAILED, describe_write_failure
from demoforge.pipeline.job import JobConfigError
from demoforge.pipeline.tasks.registry import TaskDefinitionError, TaskOptionError, UnknownTaskError
from demoforge.pipeline.workers.config import ExecutorError, WorkersLostError
from demoforge.stages.malloc import limit_malloc_arenas, make_uninitialized_reads_deterministic
from demoforge.storage.errors import StoreError
from demoforge.storage.scheduling import reset_process_priority
from demoforge.storage.write_errors import is_write_error

# Imported where used: the error types of the modules `demoforge --help` need not load (see _known_errors).

EXIT_STATUS_HELP = """exit status: 0 done; 1 failed or incomplete (e.g. every recent episode abandoned); 2 bad input or
settings; 3 the daemon stopped a failing job; 4 an OS error while writing (e.g. a full disk); 130 interrupted"""

#: Each adds one command, in the order `demoforge --help` lists them.
COMMANDS = (tasks.add_tasks_parser, tasks.add_run_parser, generate.add_generate_parser, export.add_export_parser,
            export.add_validate_parser, edit.add_edit_parser, edit.add_merge_parser, store.add_inspect_parser,
            view.add_view_parser, store.add_status_parser, daemon.add_daemon_parser, store.add_verify_parser,
            store.add_prune_parser, replay.add_replay_parser, rerender.add_rerender_parser, evaluate.add_eval_parser,
            repair.add_repair_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="demoforge", description="Segment-aware, crash-proof robot demonstrations: generate episodes from "
        "gymnasium tasks with scripted experts into a resumable store, export them as LeRobot v3.0 datasets.",
        formatter_class=HelpFormatter, epilog=EXIT_STATUS_HELP + "\n\nexample:\n  " + generate.EXAMPLE
        + "\n\nrun `demoforge COMMAND --help` for a command's options")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, show the full Python traceback instead of the short message")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    for command in sub.choices.values():  # `demoforge generate ... --debug` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error (default: off)")
    return parser


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors a person can act on (bad input, a refused store): one line, exit 2. Those of the heavier modules
    are imported when an error happens, so that a command does not load every other command's modules."""
    from demoforge.pipeline.daemon_config import DaemonConfigError
    from demoforge.pipeline.replay_run import ReplayInputError
    from demoforge.storage.catalog import JobMismatchError
    from demoforge.storage.lerobot.export import ExportError
    from demoforge.storage.lerobot.repair import RepairError
    from demoforge.storage.staging import StagingFormatError
    from demoforge.storage.viewer.files import ViewerError

    return (JobConfigError, TaskOptionError, TaskDefinitionError, UnknownTaskError, JobMismatchError, StoreError,
            ExportError, DaemonConfigError, ViewerError, ReplayInputError, ExecutorError, StagingFormatError,
            RepairError)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reset_process_priority()  # every demoforge process runs at normal priority, whatever started it
    prepare_process()
    limit_malloc_arenas()
    make_uninitialized_reads_deterministic()
    err = make_console(stderr=True)
    try:
        try:
            return args.fn(args)
        except BaseExceptionGroup as group:  # errors raised inside a task group arrive wrapped
            if args.debug:
                raise
            leaves = _leaves(group)
            known = _known_errors() + (WorkersLostError,)
            if leaves and all(isinstance(e, known) for e in leaves):
                raise leaves[0] from None
            # The first real failure; the others are usually its consequences (a closed stream, a cancel).
            first = next((e for e in leaves if is_write_error(e)), None) or next(
                (e for e in leaves if isinstance(e, Exception)), None)
            if first is not None:
                raise first from None
            raise
    except KeyboardInterrupt:
        err.print(f"demoforge {args.command}: stopped at once; committed episodes are kept")
        return 130
    except Exception as exc:
        if isinstance(exc, WorkersLostError):
            err.print(f"demoforge {args.command}: error: {exc}", markup=False)
            return EXIT_FAIL
        if args.debug:
            raise
        if isinstance(exc, _known_errors()):
            err.print(f"demoforge {args.command}: error: {exc}", markup=False)
            return EXIT_USAGE
        if is_write_error(exc):
            err.print(describe_write_failure(args.command, exc, args), markup=False)
            return EXIT_WRITE_FAILED
        err.print(f"demoforge {args.command}: internal error: {type(exc).__name__}: {exc}\n"
                  "  committed data is safe (it is durable before it counts)\n"
                  "  add --debug for the traceback, and report it", markup=False)
        return EXIT_FAIL


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out

