"""The catalog: a durable record of every attempt's state, in SQLite (WAL, synchronous=FULL).

State machine of one attempt::

    staging --commit (data fsynced first)--> committed --export--> exported --prune--> exported + pruned
       |                                        |
       +--discard (row first, then files)--> discarded(reason)      +--verify fails--> quarantined

Pruning (``demoforge prune --exported``) records the episode in the ``pruned`` table first, then deletes its
staged files: the row, its counts and content hash stay; readers of staged data skip pruned episodes.

An attempt whose run died while staging is discarded by recovery with ``counted = 0``: it is retried
with the same attempt number and seed and does not count against ``max_attempts``.
One transaction flips a state; partial unique indexes make a second commit of one episode index
impossible, whatever the code above does. A failed attempt kept as data (``generate --keep-failures``) is
committed like any other with ``kept_failure = 1``: it is an episode of its own, fills no episode index (it
counts as a spent attempt of it) and is left out of that index's one-commit rule.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
import urllib.parse
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demoforge.storage.errors import ReadOnlyError, StoreError
from demoforge.storage.paths import CATALOG_FILE, short_path
from demoforge.storage.schema import READABLE_STATES, AttemptState, Fingerprint
from demoforge.storage.write_errors import writing

CATALOG_VERSION = 2  # 2: attempts.kept_failure (a catalog of version 1 is given the column when a writer opens it)
OUR_TABLES = frozenset({"meta", "attempts"})
SQLITE_MAGIC = b"SQLite format 3\x00"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    episode_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('staging', 'committed', 'discarded', 'quarantined', 'exported')),
    seed INTEGER NOT NULL,
    row INTEGER NOT NULL DEFAULT 0,
    worker INTEGER NOT NULL DEFAULT 0,
    frames INTEGER,
    video_bytes TEXT,
    content_hash TEXT,
    terminal_reason TEXT,
    reason TEXT,
    counted INTEGER NOT NULL DEFAULT 1,
    record TEXT,
    dataset_index INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    kept_failure INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS one_commit_per_episode
    ON attempts(episode_index) WHERE state IN ('committed', 'quarantined', 'exported') AND kept_failure = 0;
CREATE UNIQUE INDEX IF NOT EXISTS one_live_attempt
    ON attempts(episode_index, attempt) WHERE state <> 'discarded' OR counted = 1;
CREATE INDEX IF NOT EXISTS attempts_by_state ON attempts(state);
CREATE TABLE IF NOT EXISTS pruned (
    episode_id TEXT PRIMARY KEY,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS recovery (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""



def _catalog_tables(path: Path) -> set[str]:
    reader = Catalog.open_read_only(path)
    try:
        return reader.tables()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} cannot be read ({exc})") \
            from None
    finally:
        reader.close()


def check_catalog_file(store_dir: Path, *, writer: bool = False) -> None:
    """Refuse a ``catalog.sqlite`` that is not ours (not SQLite, or SQLite without our tables) before anything
    opens it for writing or adds a schema to it. A missing or empty file (a run killed before it wrote the
    schema) passes. ``writer``: the caller is about to open the store for writing (a hot journal left by a
    power cut is rolled back first)."""
    path = Path(store_dir)
    catalog = path / CATALOG_FILE
    try:
        with open(catalog, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot read {short_path(catalog)}: {exc.strerror}") from None
    if not head:
        return
    if head != SQLITE_MAGIC:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} is not an SQLite database")
    try:
        tables = _catalog_tables(path)
    except StoreError:
        # A power cut while a new catalog switched to WAL leaves a hot rollback journal, which a read-only
        # connection cannot roll back. A writer lets SQLite do it (what any first write connection does), then
        # looks again; a reader keeps the error until then.
        if not (writer and (path / f"{CATALOG_FILE}-journal").exists()):
            raise
        con = sqlite3.connect(catalog)
        try:
            con.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
        finally:
            con.close()
        tables = _catalog_tables(path)
    if tables and not OUR_TABLES <= tables:
        raise StoreError(f"{short_path(path)} is not a demoforge store: {CATALOG_FILE} holds other tables "
                         f"({', '.join(sorted(tables)[:5])}); refusing to modify it")


@dataclass(frozen=True)
class ResumeState:
    """What a (re)started job needs: done episodes and the attempts already spent on the others."""

    committed: frozenset[int]
    spent_attempts: Mapping[int, int]
    quarantined: frozenset[int] = frozenset()


class CatalogError(RuntimeError):
    """The catalog refused a transition (e.g. committing an attempt that is not staging)."""


class JobMismatchError(ValueError):
    """A job was started on a store created for a different job."""


@dataclass(frozen=True)
class AttemptRow:
    episode_index: int
    attempt: int
    episode_id: str
    state: AttemptState
    seed: int
    frames: int | None
    video_bytes: dict[str, int]
    content_hash: str | None
    terminal_reason: str | None
    reason: str | None
    counted: bool
    record: dict[str, Any] | None
    dataset_index: int | None
    row_id: int = 0  # the row's position in the catalog: rows are only ever appended
    updated_at: float = 0.0
    worker: int = 0  # the env worker (thread, process or remote worker slot) that ran the attempt
    kept_failure: bool = False  # a failed attempt kept as an episode of its own (generate --keep-failures)


class Catalog:
    """Thread-safe: stages call it from worker threads; one lock serialises the connection.

    ``Catalog(store_dir)`` is the writer's opener (``open_store(path, "w")``, behind the store lock): it creates the
    schema. Readers use :meth:`open_read_only` (an SQLite ``mode=ro`` connection, no schema script; every
    write method raises :class:`ReadOnlyError`); export and verify, which flip attempt states of an existing
    store while a writer may run, use :meth:`open_existing` (no schema script, never creates the file).
    """

    def __init__(self, store_dir: Path, *, _mode: str = "create") -> None:
        self.path = Path(store_dir) / CATALOG_FILE
        self.read_only = _mode == "ro"
        self._lock = threading.RLock()
        if _mode == "create":
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        else:
            uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode={'ro' if self.read_only else 'rw'}"
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30)
        try:
            if self.read_only:
                self._db.execute("PRAGMA query_only = 1")
            else:
                if _mode == "create":
                    self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA foreign_keys=ON")
                if _mode == "create":  # one transaction: a power cut leaves all of the schema or none of it
                    self._db.executescript("BEGIN IMMEDIATE;\n" + _SCHEMA + "COMMIT;\n")
                    self._add_kept_failure_column()
            self._has_kept = self._column_exists("kept_failure")
        except BaseException:
            self._db.close()
            raise

    def _column_exists(self, name: str) -> bool:
        try:
            return any(r[1] == name for r in self._db.execute("PRAGMA table_info(attempts)").fetchall())
        except sqlite3.OperationalError:
            return False

    def _add_kept_failure_column(self) -> None:
        """Version 1 -> 2, in one transaction: the column, and the one-commit rule that leaves kept failures
        out. Readers of a version-1 catalog (never written by this version) read every row as not kept."""
        if self._column_exists("kept_failure"):
            return
        self._db.executescript(
            "BEGIN IMMEDIATE;\n"
            "ALTER TABLE attempts ADD COLUMN kept_failure INTEGER NOT NULL DEFAULT 0;\n"
            "DROP INDEX IF EXISTS one_commit_per_episode;\n"
            "CREATE UNIQUE INDEX one_commit_per_episode ON attempts(episode_index) "
            "WHERE state IN ('committed', 'quarantined', 'exported') AND kept_failure = 0;\n"
            f"INSERT OR REPLACE INTO meta VALUES ('catalog_version', '{CATALOG_VERSION}');\n"
            "COMMIT;\n")

    @classmethod
    def open_read_only(cls, store_dir: Path) -> Catalog:
        """A reader's catalog: works while a writer runs (WAL readers never block it)."""
        return cls._open_existing(store_dir, "ro")

    @classmethod
    def open_existing(cls, store_dir: Path) -> Catalog:
        """An existing catalog opened for state updates only (export, verify): no schema is created."""
        return cls._open_existing(store_dir, "rw")

    @classmethod
    def _open_existing(cls, store_dir: Path, mode: str) -> Catalog:
        try:
            return cls(store_dir, _mode=mode)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{short_path(store_dir)} is not a demoforge store: {CATALOG_FILE} cannot be read "
                             f"({exc})") from None

    # ------------------------------------------------------------------------------ plumbing
    @contextmanager
    def _tx(self, operation: str) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise ReadOnlyError(operation, f"the catalog {self.path}")
        with self._lock, writing("the catalog", self.path):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL)
                    self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                # a reader may open the file a starting writer has created before its schema
                if self.read_only and "no such table" in str(exc):
                    return []
                raise

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one consistent state of the catalog (one short read transaction)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield
            finally:
                self._db.execute("COMMIT")

    def tables(self) -> set[str]:
        return {r[0] for r in self._query("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def data_version(self) -> int:
        """Changes whenever another connection commits (SQLite's ``PRAGMA data_version``)."""
        return int(self._query("PRAGMA data_version")[0][0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the job
    def bind_job(self, fingerprint: Fingerprint) -> bool:
        """Record the job's fingerprint on a new store, or refuse a different one. True if new."""
        with self._tx("bind a job") as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (fingerprint.to_json(),))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('catalog_version', ?)", (str(CATALOG_VERSION),))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('created_at', ?)", (repr(time.time()),))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('store_id', ?)", (json.dumps(uuid.uuid4().hex),))
                return True
        stored = json.loads(row[0])
        wanted = fingerprint.to_dict()
        differing = [k for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)]
        if differing == ["keep_failures"]:
            store = self.path.parent
            if wanted.get("keep_failures"):
                raise JobMismatchError(
                    f"the store at {store} was created without --keep-failures: its failed attempts were "
                    "discarded, so it cannot start keeping them now (its failures would be partly kept). Resume "
                    "it without --keep-failures, or use a new --store to keep failures from the start")
            raise JobMismatchError(f"the store at {store} keeps failed attempts (created with --keep-failures): "
                                   "resume it with --keep-failures, or use a new --store")
        if differing:
            diffs = [f"{k}: store has {stored.get(k)!r}, this job has {wanted.get(k)!r}" for k in differing]
            raise JobMismatchError(f"the store at {self.path.parent} was created for a different job; "
                                   "use a new --store or the original settings. Differences: " + "; ".join(diffs))
        return False

    def fingerprint(self) -> Fingerprint | None:
        """The store's job (None before a job was bound); FingerprintError for an old or foreign one."""
        rows = self._query("SELECT value FROM meta WHERE key = 'fingerprint'")
        return Fingerprint.from_json(rows[0][0]) if rows else None

    def store_id(self) -> str | None:
        """The store's identity: a random id given at creation, kept for life (moving or copying the folder
        keeps it). A dataset fed by several stores tells their episodes apart by it. None for a store made
        before ids existed, until :meth:`ensure_store_id` gives it one."""
        value = self.get_meta("store_id")
        return value if isinstance(value, str) else None

    def ensure_store_id(self) -> str:
        """The store's id, created now (once, in one transaction) for a store made before ids existed."""
        with self._tx("give the store an id") as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
            if row is not None:
                return str(json.loads(row[0]))
            value = uuid.uuid4().hex
            db.execute("INSERT INTO meta VALUES ('store_id', ?)", (json.dumps(value),))
            return value

    def set_meta(self, key: str, value: Any) -> None:
        with self._tx(f"set {key!r}") as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    # ------------------------------------------------------------------------------ transitions
    def begin_attempt(self, episode_index: int, attempt: int, episode_id: str, seed: int, row: int = 0,
                      worker: int = 0) -> None:
        now = time.time()
        with self._tx(f"begin attempt {episode_id}") as db:
            db.execute("INSERT INTO attempts (episode_index, attempt, episode_id, state, seed, row, worker, "
                       "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (episode_index, attempt, episode_id, AttemptState.STAGING, seed, row, worker, now, now))

    def commit(self, episode_id: str, *, frames: int, video_bytes: Mapping[str, int], content_hash: str,
               record: Mapping[str, Any], kept_failure: bool = False) -> None:
        """Flip a staging attempt to committed. Call only after its data is durable. ``kept_failure``: a failed
        attempt kept as an episode of its own (its episode index stays open)."""
        with self._tx(f"commit {episode_id}") as db:
            cur = db.execute(
                "UPDATE attempts SET state = ?, frames = ?, video_bytes = ?, content_hash = ?, "
                "terminal_reason = ?, record = ?, updated_at = ?, kept_failure = ? WHERE episode_id = ? AND state = ?",
                (AttemptState.COMMITTED, frames, json.dumps(dict(video_bytes)), content_hash,
                 record.get("terminal_reason"), json.dumps(record, allow_nan=False), time.time(), int(kept_failure),
                 episode_id, AttemptState.STAGING))
            if cur.rowcount != 1:
                raise CatalogError(f"cannot commit {episode_id}: it is not a staging attempt")

    def discard(self, episode_id: str, *, reason: str, terminal_reason: str, counted: bool,
                record: Mapping[str, Any] | None = None) -> None:
        with self._tx(f"discard {episode_id}") as db:
            cur = db.execute(
                "UPDATE attempts SET state = ?, reason = ?, terminal_reason = ?, counted = ?, "
                "record = ?, updated_at = ? WHERE episode_id = ? AND state = ?",
                (AttemptState.DISCARDED, reason, terminal_reason, int(counted),
                 json.dumps(record) if record else None, time.time(), episode_id, AttemptState.STAGING))
            if cur.rowcount != 1:
                raise CatalogError(f"cannot discard {episode_id}: it is not a staging attempt")

    def quarantine(self, episode_id: str, reason: str) -> None:
        with self._tx(f"quarantine {episode_id}") as db:
            db.execute("UPDATE attempts SET state = ?, reason = ?, updated_at = ? "
                       "WHERE episode_id = ? AND state IN (?, ?)",
                       (AttemptState.QUARANTINED, reason, time.time(), episode_id, *READABLE_STATES))

    def mark_exported(self, dataset_indices: Mapping[str, int]) -> None:
        """Record, in one transaction, that these committed episodes are published at these indices."""
        now = time.time()
        with self._tx("mark episodes exported") as db:
            for episode_id, index in dataset_indices.items():
                cur = db.execute("UPDATE attempts SET state = ?, dataset_index = ?, updated_at = ? "
                                 "WHERE episode_id = ? AND state = ?",
                                 (AttemptState.EXPORTED, index, now, episode_id, AttemptState.COMMITTED))
                if cur.rowcount != 1:
                    raise CatalogError(f"cannot mark {episode_id} exported: it is not a committed episode")

    def mark_pruned(self, episode_ids: list[str]) -> list[str]:
        """Record, in one transaction, that these exported episodes' staged data is (about to be) deleted.
        Returns the ids marked; anything not exported is refused. The row keeps its state, counts and hash."""
        now = time.time()
        with self._tx("mark episodes pruned") as db:
            for episode_id in episode_ids:
                state = db.execute("SELECT state FROM attempts WHERE episode_id = ?", (episode_id,)).fetchone()
                if state is None or state[0] != AttemptState.EXPORTED:
                    raise CatalogError(f"cannot prune {episode_id}: only exported episodes can be pruned "
                                       f"(it is {state[0] if state else 'unknown'})")
                db.execute("INSERT OR IGNORE INTO pruned (episode_id, at) VALUES (?, ?)", (episode_id, now))
        return list(episode_ids)

    def pruned_ids(self) -> set[str]:
        """Episodes whose staged data was deleted after export (their rows stay, as ``exported``)."""
        try:
            return {r[0] for r in self._query("SELECT episode_id FROM pruned")}
        except sqlite3.OperationalError as exc:  # a catalog written before pruning existed
            if "no such table" in str(exc):
                return set()
            raise

    def pruned_count(self) -> int:
        try:
            rows = self._query("SELECT COUNT(*) FROM pruned")
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise
        return int(rows[0][0]) if rows else 0

    def log_recovery(self, action: str, detail: str) -> None:
        with self._tx("log a recovery action") as db:
            db.execute("INSERT INTO recovery (at, action, detail) VALUES (?, ?, ?)", (time.time(), action, detail))

    # ------------------------------------------------------------------------------ reads
    _BASE_COLUMNS = ("episode_index, attempt, episode_id, state, seed, frames, video_bytes, content_hash, "
                     "terminal_reason, reason, counted, record, dataset_index, id, updated_at, worker")

    def _kept_column(self) -> bool:
        if not self._has_kept:  # a reader may have opened the catalog before a writer created or upgraded it
            with self._lock:
                self._has_kept = self._column_exists("kept_failure")
        return self._has_kept

    @property
    def _COLUMNS(self) -> str:
        return self._BASE_COLUMNS + (", kept_failure" if self._kept_column() else ", 0")

    @property
    def _KEPT(self) -> str:
        """SQL for 'this row is a kept failure' (always false in a catalog from before the column)."""
        return "kept_failure = 1" if self._kept_column() else "0"

    @staticmethod
    def _row(r: tuple[Any, ...]) -> AttemptRow:
        return AttemptRow(episode_index=r[0], attempt=r[1], episode_id=r[2], state=AttemptState(r[3]), seed=r[4],
                          frames=r[5], video_bytes=json.loads(r[6]) if r[6] else {}, content_hash=r[7],
                          terminal_reason=r[8], reason=r[9], counted=bool(r[10]),
                          record=json.loads(r[11]) if r[11] else None, dataset_index=r[12], row_id=r[13],
                          updated_at=r[14], worker=r[15], kept_failure=bool(r[16]))

    @staticmethod
    def _in(values: Collection[Any]) -> str:
        return f"({', '.join('?' * len(values))})"

    def attempts(self, states: tuple[AttemptState | str, ...] | None = None) -> list[AttemptRow]:
        sql = f"SELECT {self._COLUMNS} FROM attempts"
        args: tuple[Any, ...] = ()
        if states:
            args = tuple(AttemptState(s) for s in states)
            sql += f" WHERE state IN {self._in(args)}"
        return [self._row(r) for r in self._query(sql + " ORDER BY episode_index, attempt, id", args)]

    def committed(self) -> list[AttemptRow]:
        """Committed and exported attempts: the episodes whose data is durable."""
        return self.attempts(READABLE_STATES)

    def attempts_after(self, row_id: int) -> list[AttemptRow]:
        """Rows appended after ``row_id``, in the order they were added (a tailer's new rows)."""
        return [self._row(r) for r in self._query(f"SELECT {self._COLUMNS} FROM attempts WHERE id > ? ORDER BY id",
                                                  (row_id,))]

    def attempts_by_row_id(self, row_ids: Collection[int]) -> list[AttemptRow]:
        out: list[AttemptRow] = []
        ids = sorted(row_ids)
        for k in range(0, len(ids), 500):
            part = tuple(ids[k:k + 500])
            out += [self._row(r) for r in self._query(
                f"SELECT {self._COLUMNS} FROM attempts WHERE id IN {self._in(part)} ORDER BY id", part)]
        return out

    def kept_failure_count(self) -> int:
        """Failed attempts kept as data (committed, exported or quarantined since)."""
        rows = self._query(f"SELECT COUNT(*) FROM attempts WHERE {self._KEPT} AND state <> ?", (AttemptState.STAGING,))
        return int(rows[0][0]) if rows else 0

    def count(self, state: AttemptState) -> int:
        rows = self._query("SELECT COUNT(*) FROM attempts WHERE state = ?", (AttemptState(state),))
        return int(rows[0][0]) if rows else 0

    def episode_ids(self, state: AttemptState) -> set[str]:
        return {r[0] for r in self._query("SELECT episode_id FROM attempts WHERE state = ?", (AttemptState(state),))}

    def resume_state(self) -> ResumeState:
        kept = self._KEPT
        committed = {r[0] for r in self._query(
            f"SELECT episode_index FROM attempts WHERE state IN (?, ?) AND NOT {kept}", READABLE_STATES)}
        quarantined = {r[0] for r in self._query(f"SELECT episode_index FROM attempts WHERE state = ? AND NOT {kept}",
                                                 (AttemptState.QUARANTINED,))}
        # a kept failure spent its attempt as a counted discard does
        spent = dict(self._query(f"SELECT episode_index, COUNT(*) FROM attempts WHERE (state = ? AND counted = 1) "
                                 f"OR {kept} GROUP BY episode_index", (AttemptState.DISCARDED,)))
        return ResumeState(frozenset(committed), spent, frozenset(quarantined))

    def referenced_episode_ids(self) -> set[str]:
        """Episodes whose staged folder must be kept (every state but discarded)."""
        return {r[0] for r in self._query("SELECT episode_id FROM attempts WHERE state <> ?",
                                          (AttemptState.DISCARDED,))}

    def summary(self) -> dict[str, Any]:
        """Counts for `status`: ``attempts_by_state`` and the frames are the job's episodes; failures kept as
        data are counted apart (``failures_kept``, by terminal reason)."""
        kept = self._KEPT
        by_state = Counter(dict(self._query(f"SELECT state, COUNT(*) FROM attempts WHERE NOT {kept} GROUP BY state")))
        failures = Counter({k or "?": v for k, v in self._query(
            f"SELECT terminal_reason, COUNT(*) FROM attempts WHERE {kept} AND state <> ? GROUP BY terminal_reason",
            (AttemptState.STAGING,))})
        reasons = Counter({k or "?": v for k, v in self._query(
            "SELECT terminal_reason, COUNT(*) FROM attempts WHERE state = ? GROUP BY terminal_reason",
            (AttemptState.DISCARDED,))})
        frames = self._query(f"SELECT COALESCE(SUM(frames), 0) FROM attempts WHERE state IN (?, ?) AND NOT {kept}",
                             READABLE_STATES)
        recovery = [{"at": at, "action": a, "detail": d}
                    for at, a, d in self._query("SELECT at, action, detail FROM recovery ORDER BY id")]
        by_task: dict[str, dict[str, int]] = {}
        for task, state, count in self._query(
                f"SELECT json_extract(record, '$.task'), state, COUNT(*) FROM attempts WHERE record IS NOT NULL "
                f"AND NOT {kept} GROUP BY 1, 2"):
            by_task.setdefault(str(task), {})[state] = count
        out = {"attempts_by_state": dict(by_state), "discarded_by_reason": dict(reasons),
               "committed_frames": int(frames[0][0]) if frames else 0, "pruned": len(self.pruned_ids()),
               "recovery": recovery, "failures_kept": sum(failures.values()),
               "failures_kept_by_reason": dict(failures)}
        if len(by_task) > 1:  # a suite: attempts by state for each member task
            out["attempts_by_task"] = dict(sorted(by_task.items()))
        return out
