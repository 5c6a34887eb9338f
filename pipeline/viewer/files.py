"""The files a viewer may serve, and the mapping of URL paths onto them.

A dataset version is pinned by opening every regular file in it once, at start: later requests read those
open descriptors and never look a path up on disk again. So a request cannot name anything outside the
version (``..``, a symlink planted inside, an absolute path), a file added later is not served, and a new
export that swaps the ``OUT`` link, or even prunes the opened version, does not change what is served.
"""

from __future__ import annotations

import io
import os
import resource
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

FD_HEADROOM = 256  # descriptors left for sockets, the catalog, Python itself


class ViewerError(RuntimeError):
    """The store or dataset cannot be viewed (not one, unreadable, too many files to pin)."""


class PathRefused(Exception):
    """A request path that tries to leave its directory or hides a separator (answered 403)."""


def url_path_parts(raw: str) -> tuple[str, ...]:
    """The decoded components of a request's URL path, each one a plain file name.

    Refused: encoded or literal backslashes, encoded slashes (``%2f``: a component must never decode to two),
    NUL, empty components (``//``), ``.`` and ``..`` in any encoding, undecodable bytes.
    """
    path = raw.split("?", 1)[0].split("#", 1)[0]
    lowered = path.lower()
    for bad in ("%2f", "%5c", "%00", "\\", "\x00"):
        if bad in lowered:
            raise PathRefused(f"the path holds {bad!r}")
    if not path.startswith("/"):
        raise PathRefused("the path is not absolute")
    parts = []
    for part in path[1:].split("/"):
        try:
            text = unquote(part, errors="strict")
        except UnicodeDecodeError:
            raise PathRefused("the path is not UTF-8") from None
        if text in ("", ".", "..") or "/" in text or "\\" in text or "\x00" in text:
            raise PathRefused(f"the path has a component {text!r}")
        parts.append(text)
    return tuple(parts)


@dataclass(frozen=True)
class PinnedFile:
    fd: int
    size: int


class PinnedTree:
    """Every regular file under ``root`` (symlinks are never followed), opened read-only once."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(os.path.realpath(root))
        self._files: dict[tuple[str, ...], PinnedFile] = {}
        self.skipped: set[tuple[str, ...]] = set()  # symlinks and special files found inside: refused
        try:
            for dirpath, dirnames, filenames, dirfd in os.fwalk(self.root, follow_symlinks=False):
                rel = Path(dirpath).relative_to(self.root).parts
                for name in dirnames:
                    if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                        self.skipped.add((*rel, name))
                for name in filenames:
                    self._pin(dirfd, (*rel, name))
        except BaseException:
            self.close()
            raise

    def _pin(self, dirfd: int, parts: tuple[str, ...]) -> None:
        _ensure_fd_room(len(self._files))
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dirfd)
        except OSError:  # a symlink (ELOOP), a vanished file, no permission
            self.skipped.add(parts)
            return
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            self.skipped.add(parts)
            return
        self._files[parts] = PinnedFile(fd, info.st_size)

    def paths(self) -> list[tuple[str, ...]]:
        return list(self._files)

    def get(self, parts: tuple[str, ...]) -> PinnedFile | None:
        return self._files.get(parts)

    def refused(self, parts: tuple[str, ...]) -> bool:
        """True when ``parts`` names, or passes through, a symlink or special file found inside the tree."""
        return any(parts[:i] in self.skipped for i in range(1, len(parts) + 1))

    def read(self, parts: tuple[str, ...]) -> bytes:
        pinned = self._files[parts]
        return os.pread(pinned.fd, pinned.size, 0)

    def reader(self, parts: tuple[str, ...]) -> io.BufferedReader:
        """A file object over a pinned file with its own position (pyarrow reads parquet through it)."""
        return io.BufferedReader(_PinnedReader(self._files[parts]))

    def __len__(self) -> int:
        return len(self._files)

    def close(self) -> None:
        for pinned in self._files.values():
            os.close(pinned.fd)
        self._files.clear()


class _PinnedReader(io.RawIOBase):
    """pread-based: readers in several threads never share a file offset."""

    def __init__(self, pinned: PinnedFile) -> None:
        self._pinned = pinned
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = os.pread(self._pinned.fd, len(buffer), self._pos)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._pinned.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _ensure_fd_room(open_now: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if open_now + FD_HEADROOM < soft:
        return
    wanted = open_now + 2 * FD_HEADROOM
    if hard != resource.RLIM_INFINITY and wanted > hard:
        raise ViewerError(f"the dataset has more files than this process may keep open (ulimit -n {hard}); "
                          "raise the limit and try again")
    new_soft = max(wanted, soft * 2)
    if hard != resource.RLIM_INFINITY:
        new_soft = min(new_soft, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
