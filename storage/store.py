"""The store's one front door: :func:`open_store` opens a job store in a mode, as zarr opens a ``Store``.

- ``"r"``: read only (status, inspect, sampling, the viewer, replay). No lock, an SQLite ``mode=ro``
  catalog, a staging area that creates nothing; every write path raises :class:`ReadOnlyError`. Works while a
  writer runs (WAL: readers never block it).
- ``"r+"``: an existing store whose attempt states may change beside a running writer (export marks
  ``exported``, verify ``quarantined``, the daemon prunes what it exported). No lock; never starts an attempt.
- ``"w"``: the writer, behind the store lock (one at a time; the kernel drops it when the holder dies).
  With a job ``fingerprint`` the store is created or bound to that job and recovered (what a dead run left
  is cleaned up); without one it opens the job already there (``prune``).

A :class:`Store` owns the catalog and the staging area and the protocol that keeps them consistent: an attempt
is begun (row first, then its folder), committed (its files fsynced, then its row flipped in one
transaction: a crash before the flip leaves a staging row that recovery discards) or discarded (row first,
then its files); prune and verify run through it too. Stages, commands, the daemon, export and the workers
use nothing else to reach a store's files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from demoforge.storage.catalog import Catalog, check_catalog_file
from demoforge.storage.durable import make_dirs
from demoforge.storage.errors import ReadOnlyError, StoreError, StoreLockedError
from demoforge.storage.locks import try_lock
from demoforge.storage.paths import CATALOG_FILE, LOCK_FILE, STAGING_DIR, path_problem, short_path
from demoforge.storage.prune import PruneReport, prune_exported
from demoforge.storage.recovery import RecoveryReport, recover, release_unfinished
from demoforge.storage.schema import Fingerprint
from demoforge.storage.staging import (STAGING_FORMAT, EpisodeWriter, StagingCorruptError, StagingLayout,
                                       StagingStore)
from demoforge.storage.store_verify import VerifyReport, verify_store

__all__ = ["Store", "StoreMode", "StoreError", "StoreLockedError", "ReadOnlyError", "open_store"]

StoreMode = Literal["r", "r+", "w"]


class Store:
    """An opened job store: its catalog, job, staged episodes and the writes they take. Close it (or use
    ``with``); a ``"w"`` store holds the writer lock until then."""

    def __init__(self, path: Path, mode: StoreMode, catalog: Catalog, *, lock_fd: int | None = None,
                 recovery: RecoveryReport | None = None, created: bool = False) -> None:
        self.path, self.mode, self.catalog = path, mode, catalog
        self.recovery = recovery or RecoveryReport()  # what opening it cleaned up (a job writer recovers)
        self.created = created  # a job writer that bound a new job
        self._lock_fd = lock_fd
        self._fingerprint: Fingerprint | None = None
        self._staging: StagingStore | None = None

    # ------------------------------------------------------------------------------------ what it holds
    @property
    def read_only(self) -> bool:
        return self.mode == "r"

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The job's fingerprint; None until a writer binds one (re-read until then, fixed for life after)."""
        if self._fingerprint is None:
            self._fingerprint = self.catalog.fingerprint()
        return self._fingerprint

    @property
    def layout(self) -> StagingLayout | None:
        fingerprint = self.fingerprint
        return None if fingerprint is None else StagingLayout.from_fingerprint(fingerprint)

    @property
    def staging(self) -> StagingStore | None:
        if self._staging is None:
            layout = self.layout
            if layout is not None:
                self._staging = StagingStore(self.path, layout, read_only=self.mode != "w")
        return self._staging

    def require_job(self) -> tuple[Fingerprint, StagingStore]:
        """The job and its staged episodes, or a StoreError when nothing was ever generated here."""
        fingerprint, staging = self.fingerprint, self.staging
        if fingerprint is None or staging is None:
            raise StoreError(f"{short_path(self.path)} holds no job yet: nothing was ever generated there")
        return fingerprint, staging

    def _writer(self, operation: str) -> StagingStore:
        if self.mode != "w":
            raise ReadOnlyError(operation, f"store {short_path(self.path)} (mode {self.mode!r})")
        return self.require_job()[1]

    # ------------------------------------------------------------------------------ one attempt's life
    def prepare_attempt(self, episode_id: str) -> EpisodeWriter:
        """The writer of a new attempt's staged arrays, in memory only: :meth:`begin_attempt` creates them."""
        return self._writer("begin an attempt").prepare_episode(episode_id)

    def begin_attempt(self, writer: EpisodeWriter, *, episode_index: int, attempt: int, seed: int, row: int = 0,
                      worker: int = 0) -> None:
        """Record the attempt (a ``staging`` row), then create its folder: a folder never exists without a
        row, so recovery can always tell what it is."""
        self._writer("begin an attempt")
        self.catalog.begin_attempt(episode_index, attempt, writer.episode_id, seed, row, worker)
        writer.create()

    def commit_attempt(self, episode_id: str, *, frames: int, video_bytes: Mapping[str, int], content_hash: str,
                       record: Mapping[str, Any], kept_failure: bool = False,
                       before_flip: Callable[[], None] | None = None) -> None:
        """Make the attempt data: fsync its files and folders, then flip its row in one transaction. A crash
        before the flip leaves a staging row (recovery discards it); after it the episode is complete.
        ``before_flip`` runs between the two (tests stretch that window)."""
        self._writer("commit an attempt").make_durable(episode_id)
        if before_flip is not None:
            before_flip()
        self.catalog.commit(episode_id, frames=frames, video_bytes=video_bytes, content_hash=content_hash,
                            record=dict(record), kept_failure=kept_failure)

    def discard_attempt(self, episode_id: str, *, reason: str, terminal_reason: str, counted: bool,
                        record: Mapping[str, Any] | None = None) -> None:
        """Throw the attempt away: flip its row first (a crash then leaves an orphan folder, which recovery
        deletes), then delete its files."""
        staging = self._writer("discard an attempt")
        self.catalog.discard(episode_id, reason=reason, terminal_reason=terminal_reason, counted=counted,
                             record=None if record is None else dict(record))
        staging.delete_episode(episode_id)

    def release_unfinished(self) -> list[str]:
        """After a run ends with an error: delete the files of attempts still staging (see recovery.py)."""
        return release_unfinished(self.catalog, self._writer("release unfinished attempts"))

    # ---------------------------------------------------------------------------------- maintenance
    def prune_exported(self, progress: Callable[[int, int], None] | None = None) -> PruneReport:
        """Delete the staged data of exported episodes, keeping their rows (storage/prune.py). In mode r+ (the
        daemon, beside its own running writer) only exported episodes' folders are touched, which no writer
        uses again."""
        if self.read_only:
            raise ReadOnlyError("prune", f"store {short_path(self.path)} (mode 'r')")
        _fingerprint, staging = self.require_job()
        if self.mode == "w":
            return prune_exported(self.catalog, staging, progress=progress)
        deleting = StagingStore(self.path, staging.layout)  # r+ reads through a staging area that deletes nothing
        try:
            return prune_exported(self.catalog, deleting, progress=progress)
        finally:
            deleting.close()

    def verify(self, *, quarantine: bool = False, decode: bool = True) -> VerifyReport:
        """Check every committed episode's staged data; ``quarantine`` flips the bad ones (not in mode r)."""
        if quarantine and self.read_only:
            raise ReadOnlyError("quarantine episodes", f"store {short_path(self.path)} (mode 'r')")
        return verify_store(self.catalog, self.require_job()[1], quarantine=quarantine, decode=decode)

    # ---------------------------------------------------------------------------------- closing
    def close(self) -> None:
        if self._staging is not None:
            self._staging.close()
        self.catalog.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(path: Path | str, mode: StoreMode = "r", *, fingerprint: Fingerprint | None = None) -> Store:
    """Open the store at ``path`` (see the module docstring for the modes). StoreError names what is wrong:
    not a store, a bad path, another writer holding the lock, a store a newer demoforge wrote."""
    if mode not in get_args(StoreMode):
        raise ValueError(f"mode must be one of {get_args(StoreMode)}, not {mode!r}")
    path = Path(path)
    if fingerprint is not None and mode != "w":
        raise ValueError("a job fingerprint is bound by a writer: open with mode 'w'")
    if mode == "w" and fingerprint is not None:
        return _open_job_writer(path, fingerprint)
    problem = path_problem(path)
    if problem:
        raise StoreError(f"{short_path(path)} is not a demoforge store: the path {problem}")
    if not (path / CATALOG_FILE).is_file():
        raise StoreError(f"{short_path(path)} is not a demoforge store (no {CATALOG_FILE})")
    check_catalog_file(path, writer=mode == "w")
    if mode == "r":
        return Store(path, mode, Catalog.open_read_only(path))
    if mode == "r+":
        return Store(path, mode, Catalog.open_existing(path))
    with open_store(path) as view:  # refuses a store without a job before taking its lock
        view.require_job()
    lock_fd = _acquire_lock(path)
    try:
        store = Store(path, mode, Catalog(path), lock_fd=lock_fd)
    except BaseException:
        os.close(lock_fd)
        raise
    return store


def _open_job_writer(path: Path, fingerprint: Fingerprint) -> Store:
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
    lock_fd = _acquire_lock(path)
    try:
        catalog = Catalog(path)
        created = catalog.bind_job(fingerprint)
        _check_staging_format(catalog, path)
        store = Store(path, "w", catalog, lock_fd=lock_fd, created=created)
        staging = store.staging
        assert staging is not None  # the job is bound
        store.recovery = recover(catalog, staging)
    except StagingCorruptError as exc:  # e.g. an unsafe episode id in a tampered catalog
        os.close(lock_fd)
        raise StoreError(f"cannot recover {short_path(path)}: {exc}") from None
    except BaseException:
        os.close(lock_fd)
        raise
    return store


def _check_staging_format(catalog: Catalog, path: Path) -> None:
    """Refuse a store a newer demoforge wrote; record the format this one writes (a store without the key
    was written in format 1, whose episodes stay readable)."""
    recorded = catalog.get_meta("staging_format")
    if isinstance(recorded, int) and recorded > STAGING_FORMAT:
        catalog.close()
        raise StoreError(f"{short_path(path)} was written by a newer demoforge (staging format {recorded}); this one "
                         f"writes format {STAGING_FORMAT} and reads formats 1 to {STAGING_FORMAT}: upgrade demoforge")
    if recorded != STAGING_FORMAT:
        catalog.set_meta("staging_format", STAGING_FORMAT)


def _acquire_lock(path: Path) -> int:
    fd = try_lock(path / LOCK_FILE)
    if fd is None:
        raise StoreLockedError(f"another demoforge process is writing to {path} (lock {path / LOCK_FILE})")
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
