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
use nothing else to reach a store's files. The catalog is the store's own: what others read of it (rows, counts,
the store id) and the states they change (``exported``, ``quarantined``) are :class:`Store` methods, so the
rules of a state change live in one class (tests/test_architecture.py holds that no module above storage/
reaches the catalog).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from demoforge.storage import faults
from demoforge.storage.catalog import AttemptRow, Catalog, ResumeState, check_catalog_file
from demoforge.storage.durable import make_dirs
from demoforge.storage.errors import ReadOnlyError, StoreError, StoreLockedError
from demoforge.storage.locks import try_lock
from demoforge.storage.paths import CATALOG_FILE, LOCK_FILE, STAGING_DIR, path_problem, short_path
from demoforge.storage.prune import PruneReport, prune_exported
from demoforge.storage.recovery import RecoveryReport, recover, release_unfinished
from demoforge.storage.schema import AttemptState, Fingerprint
from demoforge.storage.staging import (STAGING_FORMAT, EpisodeWriter, StagingCorruptError, StagingLayout,
                                       StagingStore)
from demoforge.storage.store_verify import VerifyReport, verify_store

__all__ = ["AttemptChanges", "Store", "StoreMode", "StoreError", "StoreLockedError", "ReadOnlyError", "open_store"]

StoreMode = Literal["r", "r+", "w"]


@dataclass(frozen=True)
class AttemptChanges:
    """What a tailing reader (storage/sampling/online.py) learns of a store in one consistent read: the rows
    added after the last one it saw and those it saw staging, the quarantined and pruned counts, and the ids
    behind a count that moved (None when it did not: reading them is the expensive part)."""

    rows: list[AttemptRow]
    quarantined: int
    pruned: int
    quarantined_ids: frozenset[str] | None
    pruned_ids: frozenset[str] | None


class Store:
    """An opened job store: its catalog, job, staged episodes and the writes they take. Close it (or use
    ``with``); a ``"w"`` store holds the writer lock until then."""

    def __init__(self, path: Path, mode: StoreMode, catalog: Catalog, *, lock_fd: int | None = None,
                 recovery: RecoveryReport | None = None, created: bool = False) -> None:
        self.path, self.mode, self._catalog = path, mode, catalog
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
            self._fingerprint = self._catalog.fingerprint()
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

    # ------------------------------------------------------------------------------ the catalog's rows
    def attempts(self, states: tuple[AttemptState | str, ...] | None = None) -> list[AttemptRow]:
        """Every attempt (or those in ``states``), by episode index, attempt and row."""
        return self._catalog.attempts(states)

    def committed(self) -> list[AttemptRow]:
        """The episodes whose data is durable: committed and exported attempts."""
        return self._catalog.committed()

    def pruned_ids(self) -> set[str]:
        """Exported episodes whose staged data was deleted (``demoforge prune``): no frames to read."""
        return self._catalog.pruned_ids()

    def store_id(self) -> str | None:
        """The store's identity (None for a store made before ids existed, until :meth:`ensure_store_id`)."""
        return self._catalog.store_id()

    def ensure_store_id(self) -> str:
        """The store's id, given now (once) to a store made before ids existed (mode r+ or w)."""
        return self._catalog.ensure_store_id()

    def summary(self) -> dict[str, Any]:
        """The counts ``demoforge status`` prints (attempts by state, frames, discards, recovery log)."""
        return self._catalog.summary()

    def resume_state(self) -> ResumeState:
        """What a resumed job finds done: committed and quarantined episode indices, attempts spent."""
        return self._catalog.resume_state()

    def kept_failure_count(self) -> int:
        """Failed attempts kept as data (``generate --keep-failures``)."""
        return self._catalog.kept_failure_count()

    def data_version(self) -> int:
        """A number that changes whenever another process commits to the catalog (cheap to poll)."""
        return self._catalog.data_version()

    def attempt_changes(self, *, after_row: int, pending: Collection[int], quarantined_seen: int,
                        pruned_seen: int) -> AttemptChanges:
        """Rows added after row ``after_row`` and the rows ``pending`` (seen staging), with the quarantined and
        pruned counts and, where a count differs from the one seen, the ids: one consistent read."""
        catalog = self._catalog
        with catalog.snapshot():
            rows = catalog.attempts_after(after_row) + catalog.attempts_by_row_id(pending)
            quarantined = catalog.count(AttemptState.QUARANTINED)
            pruned = catalog.pruned_count()
            quarantined_ids = frozenset(catalog.episode_ids(AttemptState.QUARANTINED)) \
                if quarantined != quarantined_seen else None
            pruned_ids = frozenset(catalog.pruned_ids()) if pruned != pruned_seen else None
        return AttemptChanges(rows, quarantined, pruned, quarantined_ids, pruned_ids)

    # ------------------------------------------------------------------------------ state changes
    def mark_exported(self, dataset_indices: Mapping[str, int]) -> None:
        """Record, in one transaction, that these committed episodes are published at these dataset indices
        (an export, after its version is published; mode r+ or w)."""
        self._catalog.mark_exported(dataset_indices)

    def quarantine(self, episode_id: str, reason: str) -> None:
        """Take a committed or exported episode out of every later export and read (its data failed a check)."""
        self._catalog.quarantine(episode_id, reason)

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
        self._catalog.begin_attempt(episode_index, attempt, writer.episode_id, seed, row, worker)
        writer.create()

    def commit_attempt(self, episode_id: str, *, frames: int, video_bytes: Mapping[str, int], content_hash: str,
                       record: Mapping[str, Any], kept_failure: bool = False) -> None:
        """Make the attempt data: fsync its files and folders, then flip its row in one transaction. A crash
        before the flip leaves a staging row (recovery discards it); after it the episode is complete. (The
        crash tests stretch the window between the two: storage/faults.py ``commit_window``.)"""
        self._writer("commit an attempt").make_durable(episode_id)
        faults.active().commit_window(episode_id)
        self._catalog.commit(episode_id, frames=frames, video_bytes=video_bytes, content_hash=content_hash,
                            record=dict(record), kept_failure=kept_failure)

    def discard_attempt(self, episode_id: str, *, reason: str, terminal_reason: str, counted: bool,
                        record: Mapping[str, Any] | None = None) -> None:
        """Throw the attempt away: flip its row first (a crash then leaves an orphan folder, which recovery
        deletes), then delete its files."""
        staging = self._writer("discard an attempt")
        self._catalog.discard(episode_id, reason=reason, terminal_reason=terminal_reason, counted=counted,
                             record=None if record is None else dict(record))
        staging.delete_episode(episode_id)

    def release_unfinished(self) -> list[str]:
        """After a run ends with an error: delete the files of attempts still staging (see recovery.py)."""
        return release_unfinished(self._catalog, self._writer("release unfinished attempts"))

    # ---------------------------------------------------------------------------------- maintenance
    def prune_exported(self, progress: Callable[[int, int], None] | None = None) -> PruneReport:
        """Delete the staged data of exported episodes, keeping their rows (storage/prune.py). In mode r+ (the
        daemon, beside its own running writer) only exported episodes' folders are touched, which no writer
        uses again."""
        if self.read_only:
            raise ReadOnlyError("prune", f"store {short_path(self.path)} (mode 'r')")
        _fingerprint, staging = self.require_job()
        if self.mode == "w":
            return prune_exported(self._catalog, staging, progress=progress)
        deleting = StagingStore(self.path, staging.layout)  # r+ reads through a staging area that deletes nothing
        try:
            return prune_exported(self._catalog, deleting, progress=progress)
        finally:
            deleting.close()

    def verify(self, *, quarantine: bool = False, decode: bool = True) -> VerifyReport:
        """Check every committed episode's staged data; ``quarantine`` flips the bad ones (not in mode r)."""
        if quarantine and self.read_only:
            raise ReadOnlyError("quarantine episodes", f"store {short_path(self.path)} (mode 'r')")
        return verify_store(self._catalog, self.require_job()[1], quarantine=quarantine, decode=decode)

    # ---------------------------------------------------------------------------------- closing
    def close(self) -> None:
        if self._staging is not None:
            self._staging.close()
        self._catalog.close()
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
