"""The writer's side of a job store: one writing process at a time (a lock), then recovery.

Readers never come here: they open a store with ``storage/reader.py`` (no lock, a read-only catalog).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from demoforge.storage.catalog import CATALOG_FILE, Catalog, check_catalog_file
from demoforge.storage.errors import StoreError, StoreLockedError
from demoforge.storage.paths import LOCK_FILE, path_problem, short_path
from demoforge.storage.recovery import RecoveryReport, recover
from demoforge.storage.schema import Fingerprint
from demoforge.storage.staging import STAGING_DIR, EpisodeLayout, StagingCorruptError, StagingStore

__all__ = ["JobStore", "StoreError", "StoreLockedError", "acquire_lock"]


class JobStore:
    """Opened for writing: holds the lock until :meth:`close`."""

    def __init__(self, path: Path, catalog: Catalog, staging: StagingStore, lock_fd: int,
                 recovery: RecoveryReport, created: bool) -> None:
        self.path, self.catalog, self.staging = path, catalog, staging
        self.recovery, self.created = recovery, created
        self._lock_fd = lock_fd

    @classmethod
    def open(cls, path: Path | str, fingerprint: Fingerprint) -> JobStore:
        path = Path(path)
        problem = path_problem(path)
        if problem:
            raise StoreError(f"cannot use {short_path(path)} as a store: the path {problem}")
        if path.is_dir():
            entries = set(os.listdir(path))
            if entries and not entries & {LOCK_FILE, CATALOG_FILE, STAGING_DIR}:
                raise StoreError(f"{short_path(path)} is a non-empty directory that is not a demoforge store; "
                                 "refusing to write into it (use a new or empty directory)")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {path}: {exc.strerror}") from exc
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"store directory {path} is not writable")
        check_catalog_file(path)
        lock_fd = acquire_lock(path)
        try:
            catalog = Catalog(path)
            created = catalog.bind_job(fingerprint)
            staging = StagingStore(path, EpisodeLayout.from_fingerprint(fingerprint))
            report = recover(catalog, staging)
        except StagingCorruptError as exc:  # e.g. an unsafe episode id in a tampered catalog
            os.close(lock_fd)
            raise StoreError(f"cannot recover {short_path(path)}: {exc}") from None
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(path, catalog, staging, lock_fd, report, created)

    def close(self) -> None:
        self.catalog.close()
        os.close(self._lock_fd)


def acquire_lock(path: Path) -> int:
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(f"another demoforge process is writing to {path} (lock {path / LOCK_FILE})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
