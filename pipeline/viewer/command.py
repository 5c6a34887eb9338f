"""``demoforge view``: open a store or dataset, then serve the page or write it as a static folder."""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from demoforge.pipeline.viewer.files import ViewerError
from demoforge.pipeline.viewer.server import ViewerServer, is_loopback
from demoforge.pipeline.viewer.source import ViewerSource, open_source
from demoforge.pipeline.viewer.static_site import write_site


def run_view(path: Path, *, host: str, port: int, html: Path | None) -> int:
    if not 0 <= port <= 65535:
        raise ViewerError(f"--port {port} is not a port number (0 to 65535; 0 picks a free one)")
    source = open_source(path)
    try:
        summary = source.summary
        what = f"{summary.kind} {path}" + (f" (version {summary.version})" if summary.version else "")
        count = len(source.entries())
        if html is not None:
            report = write_site(source, html, progress=_progress)
            print(f"wrote the viewer of {what} to {report.out}: {report.episodes} episode(s), {report.videos} video "
                  f"file(s), {report.bytes / 2**20:.1f} MiB; open {report.out / 'index.html'} in a browser",
                  flush=True)
            return 0
        try:
            server = ViewerServer(source, host, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ViewerError(f"port {port} on {host} is in use; choose another with --port (0 picks a free "
                                  "one)") from None
            raise ViewerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        try:
            # The handlers first: whoever reads the URL may stop the server the moment it is printed.
            with _stopped_by_signals():
                if not is_loopback(host):
                    print(f"demoforge view: warning: serving on {host}, not loopback: anyone who can reach this "
                          f"machine on port {server.port} can watch every episode of {path} and mark episodes "
                          "rejected (no authentication)", file=sys.stderr, flush=True)
                print(f"serving {what}, {count} {'attempt' if summary.kind == 'store' else 'episode'}(s), at "
                      f"{server.url} ({_writes(source)}; Ctrl-C stops)", flush=True)
                server.serve_forever()
        except _Stop:
            print("stopped", flush=True)
        finally:
            server.close()
        return 0
    finally:
        source.close()


class _Stop(BaseException):
    """SIGINT or SIGTERM arrived: the server stops (exit 0)."""


@contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM (a service manager's stop) end the server, also when this process was started with
    SIGINT ignored or blocked, as a child of a process that ignores it may be."""
    def stop(_signum: int, _frame: Any) -> None:
        raise _Stop

    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, stop) for sig in stops}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _writes(source: ViewerSource) -> str:
    marks = source.rejections
    return "read-only" if marks is None else f"the dataset is read-only; rejected marks go to {marks.path}"


def _progress(done: int, total: int) -> None:
    if done == total or done % 100 == 0:
        print(f"prepared {done}/{total} episodes", file=sys.stderr, flush=True)
