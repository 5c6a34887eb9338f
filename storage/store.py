"""The writer's side of a job store: one writing process at a time (a lock), then recovery.

Readers never come here: they open a store with ``storage/reader.py`` (no lock, a read-only catalog).
"""

from __future__ import annotations

import os
from pathlib import Path

from demoforge.storage.catalog import CATALOG_FILE, Catalog, check_catalog_file
from demoforge.storage.durable import make_dirs
from demoforge.storage.errors import StoreError, StoreLockedError
from demoforge.storage.locks import try_lock
from demoforge.storage.paths import LOCK_FILE, path_problem, short_path
from demoforge.storage.recovery import RecoveryReport, recover
from demoforge.storage.schema import Fingerprint
from demoforge.storage.staging import STAGING_DIR, STAGING_FORMAT, StagingLayout, StagingCorruptError, StagingStore

__all__ = ["JobStore", "StoreError", "StoreLockedError", "acquire_lock"]


def _check_staging_format(catalog: Catalog, path: Path) -> None:
    """Refuse a store a newer demoforge wrote; record that this one writes format 2 (a store without the key
    was written in format 1, whose episodes stay readable)."""
    recorded = catalog.get_meta("staging_format")
    if isinstance(recorded, int) and recorded > STAGING_FORMAT:
        catalog.close()
        raise StoreError(f"{short_path(path)} was written by a newer demoforge (staging format {recorded}); this one "
                         f"writes format {STAGING_FORMAT} and reads formats 1 to {STAGING_FORMAT}: upgrade demoforge")
    if recorded != STAGING_FORMAT:
        catalog.set_meta("staging_format", STAGING_FORMAT)


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
            make_dirs(path)  # fsynced into its parent: a store folder lost at a power cut loses every episode
        except OSError as exc:
            raise StoreError(f"cannot create store directory {path}: {exc.strerror}") from exc
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"store directory {path} is not writable")
        check_catalog_file(path, writer=True)
        lock_fd = acquire_lock(path)
        try:
            catalog = Catalog(path)
            created = catalog.bind_job(fingerprint)
            _check_staging_format(catalog, path)
            staging = StagingStore(path, StagingLayout.from_fingerprint(fingerprint))
            report = recover(catalog, staging)
        except StagingCorruptError as exc:  # e.g. an unsafe episode id in a tampered catalog
            os.close(lock_fd)
            raise StoreError(f"cannot recover {short_path(path)}: {exc}") from None
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(path, catalog, staging, lock_fd, report, created)

    def close(self) -> None:
        self.staging.close()
        self.catalog.close()
        os.close(self._lock_fd)


def acquire_lock(path: Path) -> int:
    fd = try_lock(path / LOCK_FILE)
    if fd is None:
        raise StoreLockedError(f"another demoforge process is writing to {path} (lock {path / LOCK_FILE})")
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
