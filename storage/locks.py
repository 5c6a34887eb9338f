"""One kind of lock file: an exclusive, non-blocking ``flock`` held for as long as its descriptor is open.

The store's writer lock and a dataset's export lock are both this; the kernel drops the lock when the holder
dies (``kill -9`` included), so there is never a stale lock to clean up."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def try_lock(path: Path) -> int | None:
    """Open (creating) ``path`` and take its lock: the open descriptor, or None when another process holds it.
    Close the descriptor to release the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd
