"""A job store directory: one writer at a time (a lock), the catalog, the Zarr staging area, recovery."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from demoforge.storage.catalog import CATALOG_FILE, Catalog
from demoforge.storage.recovery import RecoveryReport, recover
from demoforge.storage.staging import STAGING_DIR, STAGING_FORMAT, EpisodeLayout, StagingCorruptError, StagingStore

LOCK_FILE = "writer.lock"
NAME_MAX = 255  # bytes in one path component (Linux filesystems)
PATH_MAX = 4096  # bytes in a whole path, the terminating NUL included
SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreError(RuntimeError):
    """The store directory cannot be used (not writable, not a directory, not a demoforge store)."""


class StoreLockedError(StoreError):
    """Another process is writing to this store."""


def short_path(path: Path | str, keep: int = 100) -> str:
    """A path for an error message: hostile names can be thousands of characters long."""
    text = str(path)
    return repr(text) if len(text) <= keep else repr(f"{text[:keep // 2]}...{text[-keep // 2:]}") + \
        f" ({len(text)} characters)"


def path_problem(path: Path | str, reserve: int = 0) -> str | None:
    """Why ``path`` cannot name a store or dataset, or None; checked before anything is created, so a bad
    name never leaves half-made parent directories behind. ``reserve``: bytes appended to the last
    component for a sibling (a dataset's ``NAME.versions``)."""
    text = str(path)
    if "\x00" in text:
        return "contains a NUL byte"
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        return f"is {len(raw)} bytes long; the limit is {PATH_MAX - 1}"
    for part in Path(text).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"has a component of {len(os.fsencode(part))} bytes; the limit is {NAME_MAX}"
    if reserve and len(os.fsencode(Path(text).name)) + reserve > NAME_MAX:
        return f"ends in a name longer than {NAME_MAX - reserve} bytes"
    return None


def _check_catalog_file(path: Path) -> None:
    """Refuse a ``catalog.sqlite`` that is not ours (not SQLite, or SQLite without our tables) before
    :class:`Catalog` adds its schema to it."""
    catalog = path / CATALOG_FILE
    try:
        with open(catalog, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot read {short_path(catalog)}: {exc.strerror}") from None
    if not head:
        return  # created by a run killed before it wrote the schema
    if head != SQLITE_MAGIC:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} is not an SQLite database")
    try:
        db = sqlite3.connect(catalog, timeout=30)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} cannot be read ({exc})") \
            from None
    if tables and not {"meta", "attempts"} <= tables:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} holds other tables "
                         f"({', '.join(sorted(tables)[:5])}); refusing to modify it")


def layout_from_fingerprint(fingerprint: Mapping[str, Any]) -> EpisodeLayout:
    from demoforge.pipeline.tasks.registry import TaskDefinitionError, check_name

    try:  # names from the catalog become paths: a tampered catalog must not lead a reader outside the store
        for camera in fingerprint["cameras"]:
            check_name("camera", camera[0])
        for feature in fingerprint["state_shapes"]:
            check_name("state feature", feature)
    except TaskDefinitionError as exc:
        raise StoreError(f"the store's job fingerprint is unsafe: {exc}") from None
    return EpisodeLayout(state_shapes={k: tuple(v) for k, v in fingerprint["state_shapes"].items()},
                         action_shape=tuple(fingerprint["action_shape"]),
                         cameras=tuple(c[0] for c in fingerprint["cameras"]),
                         chunk_frames=int(fingerprint["chunk_frames"]))


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
    def open(cls, path: Path | str, fingerprint: Mapping[str, Any]) -> JobStore:
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
        _check_catalog_file(path)
        lock_fd = acquire_lock(path)
        try:
            catalog = Catalog(path)
            created = catalog.bind_job(fingerprint)
            _check_staging_format(catalog, path)
            staging = StagingStore(path, layout_from_fingerprint(fingerprint))
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


def open_catalog_readonly(path: Path | str) -> Catalog:
    """The catalog of an existing store, for status and export; works while a writer runs (WAL)."""
    path = Path(path)
    problem = path_problem(path)
    if problem:
        raise StoreError(f"{short_path(path)} is not a demoforge store: the path {problem}")
    if not (path / CATALOG_FILE).is_file():
        raise StoreError(f"{path} is not a demoforge store (no catalog.sqlite)")
    _check_catalog_file(path)
    try:
        return Catalog(path)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} cannot be read ({exc})") \
            from None
