"""Serve the viewer over HTTP: range requests, nothing outside the opened store or dataset, which is never
written (the one write a page may ask for, ``POST /api/rejected``, changes the list file beside a dataset).

The standard library's ``ThreadingHTTPServer``: the viewer serves one person on their own machine, so a
thread per connection is plenty, and the two things a video page needs beyond it (range requests and safe
paths) are short enough to own here rather than add a web framework to the install.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from demoforge.pipeline.viewer.files import PathRefused, url_path_parts
from demoforge.pipeline.viewer.pages import (
    REJECTED_API,
    REJECTED_SCRIPT,
    content_type,
    data_script,
    episode_key_of,
    load_assets,
    rejected_payload,
)
from demoforge.pipeline.viewer.source import EPISODE_KEY, ViewerSource, page_index

COPY_CHUNK = 1 << 20
MAX_POST_BYTES = 4096
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; media-src 'self'; "
                               "style-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'",
}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def byte_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """``(first, last)`` inclusive for a single satisfiable range, None to send the whole file (no header, or
    one this server does not parse: several ranges), "unsatisfiable" for a range past the end."""
    if not header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if not match or not (match[1] or match[2]):
        return None
    if match[1]:
        first = int(match[1])
        last = min(int(match[2]), size - 1) if match[2] else size - 1
        if match[2] and int(match[2]) < first:
            return None  # invalid: ignore the header (RFC 9110 14.2)
    else:
        suffix = int(match[2])
        if suffix == 0:
            return "unsatisfiable"
        first, last = max(size - suffix, 0), size - 1
    if first >= size:
        return "unsatisfiable"
    return first, last


class _Body:
    """A response body: a pinned file (read with pread) or bytes in memory."""

    def __init__(self, size: int, read: Any) -> None:
        self.size = size
        self.read = read  # read(offset, length) -> bytes


class ViewerApp:
    """Maps a request path onto a response body; shared by every handler thread."""

    def __init__(self, source: ViewerSource) -> None:
        self.source = source
        self.assets = load_assets()
        self.index = data_script("index", page_index(source))

    def resolve(self, raw_path: str) -> tuple[int, _Body | None, str]:
        """(status, body, content type) for a GET of ``raw_path``."""
        if raw_path.split("?", 1)[0] in ("/", "/index.html"):
            return self._bytes(self.assets["index.html"], "index.html")
        try:
            parts = url_path_parts(raw_path)
        except PathRefused:
            return HTTPStatus.FORBIDDEN, None, ""
        head, rest = parts[0], parts[1:]
        if head == "static" and len(rest) == 1 and rest[0] in self.assets and rest[0] != "index.html":
            return self._bytes(self.assets[rest[0]], rest[0])
        if head == "data" and rest == ("index.js",):
            return self._bytes(self.index, "index.js")
        if head == "data" and rest == (REJECTED_SCRIPT,):
            return self._bytes(data_script("rejected", rejected_payload(self.source, writable=True)), REJECTED_SCRIPT)
        if head == "data" and len(rest) == 1 and (key := episode_key_of(rest[0])) is not None:
            try:
                view = self.source.episode(key)
            except KeyError:
                return HTTPStatus.NOT_FOUND, None, ""
            return self._bytes(data_script(f"episode-{key}", view.to_json()), rest[0])
        if head == "files" and rest and self.source.files is not None:
            files = self.source.files
            pinned = files.get(rest)
            if pinned is None:
                return (HTTPStatus.FORBIDDEN if files.refused(rest) else HTTPStatus.NOT_FOUND), None, ""
            return HTTPStatus.OK, _Body(pinned.size, lambda off, n, fd=pinned.fd: _pread(fd, n, off)), \
                content_type(rest[-1])
        if head == "media" and rest:
            data = self.source.media(rest)
            if data is not None:
                return self._bytes(data, rest[-1])
        return HTTPStatus.NOT_FOUND, None, ""

    def post(self, raw_path: str, content_type: str, body: bytes) -> tuple[int, bytes]:
        """``POST /api/rejected`` with ``{"key": "3", "rejected": true}``: mark (or unmark) an episode rejected in
        the dataset's list file; answers the list as JSON. The only request that writes, and never the dataset."""
        if raw_path.split("?", 1)[0] != REJECTED_API:
            return HTTPStatus.NOT_FOUND, b""
        marks = self.source.rejections
        if marks is None:
            return HTTPStatus.METHOD_NOT_ALLOWED, b""
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            return HTTPStatus.UNSUPPORTED_MEDIA_TYPE, b""  # a cross-site form cannot send JSON without a preflight
        try:
            request = json.loads(body)
            key, rejected = str(request["key"]), request["rejected"]
            if not isinstance(rejected, bool) or not EPISODE_KEY.fullmatch(key):
                raise ValueError("rejected must be true or false, key an episode key")
            keys = marks.set(key, rejected)
        except (ValueError, KeyError, TypeError):
            return HTTPStatus.BAD_REQUEST, b""
        return HTTPStatus.OK, json.dumps({"keys": keys}).encode()

    @staticmethod
    def _bytes(data: bytes, name: str) -> tuple[int, _Body, str]:
        view = memoryview(data)
        return HTTPStatus.OK, _Body(len(data), lambda off, n: view[off:off + n]), content_type(name)


def _pread(fd: int, length: int, offset: int) -> bytes:
    return os.pread(fd, length, offset)


class _Handler(BaseHTTPRequestHandler):
    server_version = "demoforge-view"
    protocol_version = "HTTP/1.1"
    app: ViewerApp
    allowed_hosts: set[str] | None  # Host header names accepted (None: any); defends a loopback server
    quiet: bool

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != REJECTED_API:
            return self._status(HTTPStatus.NOT_IMPLEMENTED)  # the one thing a page may write; nothing else
        host = self.headers.get("Host", "")
        if self.allowed_hosts is not None and _host_name(host) not in self.allowed_hosts:
            return self._status(HTTPStatus.FORBIDDEN)
        origin = self.headers.get("Origin")
        if origin is not None and origin.rstrip("/") not in (f"http://{host}", f"https://{host}"):
            return self._status(HTTPStatus.FORBIDDEN)  # another site's page posting to this server
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_POST_BYTES:
            return self._status(HTTPStatus.BAD_REQUEST if length <= 0 else HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        body = self.rfile.read(length)
        try:
            status, payload = self.app.post(self.path, self.headers.get("Content-Type", ""), body)
        except Exception as exc:  # an unwritable list file: this request fails, the server lives
            print(f"demoforge view: POST {self.path[:200]!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return self._status(HTTPStatus.INTERNAL_SERVER_ERROR)
        if status != HTTPStatus.OK:
            return self._status(status)
        self.send_response(status)
        self._headers({"Content-Type": "application/json", "Content-Length": str(len(payload)),
                       "Cache-Control": "no-store"})
        self.wfile.write(payload)

    def _respond(self, send_body: bool) -> None:
        if self.allowed_hosts is not None and _host_name(self.headers.get("Host", "")) not in self.allowed_hosts:
            return self._status(HTTPStatus.FORBIDDEN)  # DNS rebinding: a foreign name resolving to loopback
        try:
            status, body, ctype = self.app.resolve(self.path)
        except Exception as exc:  # a corrupt episode, an unreadable file: one request fails, the server lives
            print(f"demoforge view: {self.path[:200]!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return self._status(HTTPStatus.INTERNAL_SERVER_ERROR)
        if body is None:
            return self._status(status)
        span = byte_range(self.headers.get("Range"), body.size)
        if span == "unsatisfiable":
            return self._status(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, {"Content-Range": f"bytes */{body.size}"})
        first, last = span if isinstance(span, tuple) else (0, body.size - 1)
        headers = {"Content-Type": ctype, "Accept-Ranges": "bytes", "Cache-Control": "no-cache"}
        if isinstance(span, tuple):
            headers["Content-Range"] = f"bytes {first}-{last}/{body.size}"
        self.send_response(HTTPStatus.PARTIAL_CONTENT if isinstance(span, tuple) else HTTPStatus.OK)
        self._headers({**headers, "Content-Length": str(max(last - first + 1, 0))})
        if not send_body:
            return
        offset = first
        try:
            while offset <= last:
                chunk = body.read(offset, min(COPY_CHUNK, last - offset + 1))
                if not chunk:
                    break
                self.wfile.write(chunk)
                offset += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the browser dropped a request it no longer needs (a seek)

    def _status(self, status: int, extra: dict[str, str] | None = None) -> None:
        text = f"{status} {HTTPStatus(status).phrase}\n".encode()
        self.send_response(status)
        self._headers({"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(text)), **(extra or {})})
        if self.command != "HEAD":
            self.wfile.write(text)

    def _headers(self, headers: dict[str, str]) -> None:
        for key, value in {**SECURITY_HEADERS, **headers}.items():
            self.send_header(key, value)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class ViewerServer:
    """The viewer on ``http://host:port/``; port 0 picks a free port (see :attr:`url`)."""

    def __init__(self, source: ViewerSource, host: str = "127.0.0.1", port: int = 8765, quiet: bool = True) -> None:
        loopback = is_loopback(host)
        handler = type("ViewerHandler", (_Handler,), {
            "app": ViewerApp(source), "quiet": quiet,
            "allowed_hosts": (LOOPBACK_NAMES | {host}) if loopback else None})
        self.httpd = _Server((host, port), handler)
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ViewerServer:
        """Serve from a background thread (tests, tools)."""
        self._thread = threading.Thread(target=self.serve_forever, name="demoforge-view", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()
