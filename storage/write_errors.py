"""A failed write, named: what was being written and where, so a full disk reaches a person as a few lines.

The OS says only "No space left on device"; zarr's writes do not even carry the file name. Writers wrap their
I/O in :func:`writing` so the error that leaves them says which episode, catalog or dataset version it was,
and the path. :class:`StorageWriteError` is an ``OSError`` (same errno), so callers that catch ``OSError``
still do.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class StorageWriteError(OSError):
    """Writing ``what`` at ``path`` failed with an OS error (``errno`` as the cause's)."""

    def __init__(self, what: str, path: Path | str, cause: BaseException) -> None:
        code = getattr(cause, "errno", None) or (errno.ENOSPC if is_disk_full(cause) else errno.EIO)
        reason = getattr(cause, "strerror", None) or str(cause)
        super().__init__(code, reason)
        self.what = what
        self.path = Path(path)
        self.filename = str(path)

    def __str__(self) -> str:
        return f"{self.strerror} while writing {self.what} at {self.path}"

    def __reduce__(self):  # survive pickling across a process boundary (an export child)
        return (_rebuild, (self.what, str(self.path), self.errno, self.strerror))


def _rebuild(what: str, path: str, code: int, reason: str) -> StorageWriteError:
    return StorageWriteError(what, path, OSError(code, reason))


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # SQLite reports a full disk as SQLITE_FULL, not as an errno.
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc)


def is_not_permitted(exc: BaseException) -> bool:
    """The folder may not be written (permissions, or a read-only filesystem): freeing space would not help."""
    return isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


def is_write_error(exc: BaseException) -> bool:
    """An OS-level failure to store data (full disk, I/O error, read-only filesystem, ...)."""
    if isinstance(exc, StorageWriteError):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return "full" in text or "disk I/O" in text or "readonly" in text
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS,
                                                        errno.EFBIG)


@contextmanager
def writing(what: str, path: Path | str) -> Iterator[None]:
    """Re-raise an OS-level write failure inside the block as a :class:`StorageWriteError` naming it."""
    try:
        yield
    except StorageWriteError:
        raise
    except (OSError, sqlite3.OperationalError) as exc:
        if not is_write_error(exc):
            raise
        raise StorageWriteError(what, path, exc) from exc


def free_bytes(path: Path | str) -> int | None:
    """Free bytes on the filesystem that holds (or would hold) ``path``; None if it cannot be measured."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free
    except OSError:
        return None


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"
