"""A job store directory: one writer at a time (a lock), the catalog, the Zarr staging area, recovery."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from demoforge.storage.catalog import Catalog
from demoforge.storage.recovery import RecoveryReport, recover
from demoforge.storage.staging import EpisodeLayout, StagingStore

LOCK_FILE = "writer.lock"


class StoreError(RuntimeError):
    """The store directory cannot be used (not writable, not a directory, not a demoforge store)."""


class StoreLockedError(StoreError):
    """Another process is writing to this store."""


def layout_from_fingerprint(fingerprint: Mapping[str, Any]) -> EpisodeLayout:
    return EpisodeLayout(state_shapes={k: tuple(v) for k, v in fingerprint["state_shapes"].items()},
                         action_shape=tuple(fingerprint["action_shape"]),
                         cameras=tuple(c[0] for c in fingerprint["cameras"]),
                         chunk_frames=int(fingerprint["chunk_frames"]))


class JobStore:
    """Opened for writing: holds the lock until :meth:`close`."""

    def __init__(self, path: Path, catalog: Catalog, staging: StagingStore, lock_fd: int,
                 recovery: RecoveryReport, created: bool) -> None:
        self.path, self.catalog, self.staging = path, catalog, staging
        self.recovery, self.created = recovery, created
        self._lock_fd = lock_fd

    @classmethod
    def open(cls, path: Path | str, fingerprint: Mapping[str, Any]) -> JobStore:
        path = Path(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {path}: {exc.strerror}") from exc
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"store directory {path} is not writable")
        lock_fd = acquire_lock(path)
        try:
            catalog = Catalog(path)
            created = catalog.bind_job(fingerprint)
            staging = StagingStore(path, layout_from_fingerprint(fingerprint))
            report = recover(catalog, staging)
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


def open_catalog_readonly(path: Path | str) -> Catalog:
    """The catalog of an existing store, for status and export; works while a writer runs (WAL)."""
    path = Path(path)
    if not (path / "catalog.sqlite").exists():
        raise StoreError(f"{path} is not a demoforge store (no catalog.sqlite)")
    return Catalog(path)
