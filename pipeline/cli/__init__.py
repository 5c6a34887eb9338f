"""The ``demoforge`` command line: the parser assembled from one module per command group (each owns its
commands' options and handlers), and ``main``, which turns an error into a few lines a person can act on."""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from demoforge.pipeline.cli import (
    convert,
    daemon,
    edit,
    evaluate,
    export,
    generate,
    multiply,
    repair,
    replay,
    rerender,
    store,
    tasks,
    view,
)
from demoforge.pipeline.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, HelpFormatter, make_console
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

#: A closed output pipe (``demoforge tasks --json | head -1``): the status a shell tool stopped by SIGPIPE has.
EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE

EXIT_STATUS_HELP = """exit status: 0 done; 1 failed or incomplete (e.g. every recent episode abandoned); 2 bad input or
settings; 3 the daemon stopped a failing job; 4 an OS error while writing (e.g. a full disk); 130 interrupted;
141 the output's reader went away (e.g. `| head`)"""

#: Each adds one command, in the order `demoforge --help` lists them.
COMMANDS = (tasks.add_tasks_parser, tasks.add_run_parser, generate.add_generate_parser, multiply.add_multiply_parser,
            export.add_export_parser, convert.add_convert_parser,
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
    parser.add_argument("--version", action=_Version, help="print demoforge's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # none: main prints this help
    for add in COMMANDS:
        add(sub)
    for command in sub.choices.values():  # `demoforge generate ... --debug` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error (default: off)")
    return parser


class _Version(argparse.Action):
    """``--version``: the installed package's version, read from its metadata when asked (not at every start)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"demoforge {package_version()}")
        parser.exit()


def package_version() -> str:
    """The version pip installed (``importlib.metadata``), or a note when demoforge runs from an uninstalled tree."""
    import importlib.metadata

    try:
        return importlib.metadata.version("demoforge")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown: not installed as a package)"


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors a person can act on (bad input, a refused store): one line, exit 2. Those of the heavier modules
    are imported when an error happens, so that a command does not load every other command's modules."""
    from demoforge.pipeline.daemon_config import DaemonConfigError
    from demoforge.pipeline.replay_run import ReplayInputError
    from demoforge.storage.catalog import JobMismatchError
    from demoforge.storage.convert.report import ConvertError
    from demoforge.storage.lerobot.export import ExportError
    from demoforge.storage.lerobot.repair import RepairError
    from demoforge.storage.staging import StagingFormatError
    from demoforge.pipeline.viewer.files import ViewerError

    return (JobConfigError, TaskOptionError, TaskDefinitionError, UnknownTaskError, JobMismatchError, StoreError,
            ExportError, DaemonConfigError, ViewerError, ReplayInputError, ExecutorError, StagingFormatError,
            RepairError, ConvertError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status. When the reader of the output goes away
    (``demoforge tasks --json | head -1``), the command ends quietly with :data:`EXIT_PIPE_CLOSED`, as SIGPIPE
    ends a shell tool, wherever the write that found it happened (a command, ``--help``, the last flush)."""
    try:
        try:
            return _run(argv)
        finally:  # what is still buffered: a closed pipe shows here, not as "Exception ignored" at exit
            _flush(sys.stdout, sys.stderr)
    except BrokenPipeError:
        if not _closed_outputs():
            raise  # another pipe (a child process's): a real failure
        return _output_gone()
    except SystemExit as exit_:
        if not isinstance(exit_.__context__, BrokenPipeError):
            raise
        return _output_gone()  # rich's console meets a closed pipe with exit 1: the same status as ours


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `demoforge`: what it can do
        parser.print_help()
        return EXIT_OK
    reset_process_priority()  # every demoforge process runs at normal priority, whatever started it
    prepare_process()
    limit_malloc_arenas()
    make_uninitialized_reads_deterministic()
    err = make_console(stderr=True)
    try:
        try:
            return args.fn(args)
        except BaseExceptionGroup as group:  # errors raised inside a task group arrive wrapped
            leaves = _leaves(group)
            closed = next((e for e in leaves if isinstance(e, BrokenPipeError)), None)
            if closed is not None and _closed_outputs():
                raise closed from None
            if args.debug:
                raise
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
        if isinstance(exc, BrokenPipeError) and _closed_outputs():
            raise  # the reader went away: main ends quietly
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


def _flush(*streams: TextIO | None) -> None:
    for stream in streams:
        if stream is not None:
            stream.flush()


def _closed_outputs() -> list[TextIO]:
    """stdout and stderr where they are pipes whose reader has gone (the write end polls POLLERR)."""
    closed = []
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            if any(events & select.POLLERR for _fd, events in poller.poll(0)):
                closed.append(stream)
        except (AttributeError, OSError, ValueError):  # no stream, or not a file (a test's capture)
            continue
    return closed


def _output_gone() -> int:
    """Point the closed streams at /dev/null, so that nothing written later (a buffer flushed at exit) raises
    again, and return the status of a shell tool stopped by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in _closed_outputs():
            os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)
    return EXIT_PIPE_CLOSED
