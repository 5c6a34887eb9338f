"""The catalog: a durable record of every attempt's state, in SQLite (WAL, synchronous=FULL).

State machine of one attempt::

    staging --commit (data fsynced first)--> committed --export--> exported
       |                                        |
       +--discard (row first, then files)--> discarded(reason)      +--verify fails--> quarantined

An attempt whose run died while staging is discarded by recovery with ``counted = 0``: it is retried
with the same attempt number and seed and does not count against ``max_attempts``.
One transaction flips a state; partial unique indexes make a second commit of one episode index
impossible, whatever the code above does.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demoforge.pipeline.records import ResumeState

CATALOG_FILE = "catalog.sqlite"
CATALOG_VERSION = 1

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
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS one_commit_per_episode
    ON attempts(episode_index) WHERE state IN ('committed', 'quarantined', 'exported');
CREATE UNIQUE INDEX IF NOT EXISTS one_live_attempt
    ON attempts(episode_index, attempt) WHERE state <> 'discarded' OR counted = 1;
CREATE INDEX IF NOT EXISTS attempts_by_state ON attempts(state);
CREATE TABLE IF NOT EXISTS recovery (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""



class CatalogError(RuntimeError):
    """The catalog refused a transition (e.g. committing an attempt that is not staging)."""


class JobMismatchError(ValueError):
    """A job was started on a store created for a different job."""


@dataclass(frozen=True)
class AttemptRow:
    episode_index: int
    attempt: int
    episode_id: str
    state: str
    seed: int
    frames: int | None
    video_bytes: dict[str, int]
    content_hash: str | None
    terminal_reason: str | None
    reason: str | None
    counted: bool
    record: dict[str, Any] | None
    dataset_index: int | None


class Catalog:
    """Thread-safe: stages call it from worker threads; one lock serialises the connection."""

    def __init__(self, store_dir: Path) -> None:
        self.path = Path(store_dir) / CATALOG_FILE
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)

    # ------------------------------------------------------------------------------ plumbing
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------------------ the job
    def bind_job(self, fingerprint: Mapping[str, Any]) -> bool:
        """Record the job's fingerprint on a new store, or refuse a different one. True if new."""
        wanted = json.loads(json.dumps(fingerprint, sort_keys=True))
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (json.dumps(wanted, sort_keys=True),))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('catalog_version', ?)", (str(CATALOG_VERSION),))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('created_at', ?)", (repr(time.time()),))
                return True
        stored = json.loads(row[0])
        if stored != wanted:
            diffs = [f"{k}: store has {stored.get(k)!r}, this job has {wanted.get(k)!r}"
                     for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)]
            raise JobMismatchError(f"the store at {self.path.parent} was created for a different job; "
                                   "use a new --store or the original settings. Differences: " + "; ".join(diffs))
        return False

    def fingerprint(self) -> dict[str, Any] | None:
        rows = self._query("SELECT value FROM meta WHERE key = 'fingerprint'")
        return json.loads(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    # ------------------------------------------------------------------------------ transitions
    def begin_attempt(self, episode_index: int, attempt: int, episode_id: str, seed: int, row: int = 0,
                      worker: int = 0) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO attempts (episode_index, attempt, episode_id, state, seed, row, worker, "
                       "created_at, updated_at) VALUES (?, ?, ?, 'staging', ?, ?, ?, ?, ?)",
                       (episode_index, attempt, episode_id, seed, row, worker, now, now))

    def commit(self, episode_id: str, *, frames: int, video_bytes: Mapping[str, int], content_hash: str,
               record: Mapping[str, Any]) -> None:
        """Flip a staging attempt to committed. Call only after its data is durable."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE attempts SET state = 'committed', frames = ?, video_bytes = ?, content_hash = ?, "
                "terminal_reason = ?, record = ?, updated_at = ? WHERE episode_id = ? AND state = 'staging'",
                (frames, json.dumps(dict(video_bytes)), content_hash, record.get("terminal_reason"),
                 json.dumps(record, allow_nan=False), time.time(), episode_id))
            if cur.rowcount != 1:
                raise CatalogError(f"cannot commit {episode_id}: it is not a staging attempt")

    def discard(self, episode_id: str, *, reason: str, terminal_reason: str, counted: bool,
                record: Mapping[str, Any] | None = None) -> None:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE attempts SET state = 'discarded', reason = ?, terminal_reason = ?, counted = ?, "
                "record = ?, updated_at = ? WHERE episode_id = ? AND state = 'staging'",
                (reason, terminal_reason, int(counted), json.dumps(record) if record else None, time.time(),
                 episode_id))
            if cur.rowcount != 1:
                raise CatalogError(f"cannot discard {episode_id}: it is not a staging attempt")

    def quarantine(self, episode_id: str, reason: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE attempts SET state = 'quarantined', reason = ?, updated_at = ? "
                       "WHERE episode_id = ? AND state IN ('committed', 'exported')",
                       (reason, time.time(), episode_id))

    def mark_exported(self, dataset_indices: Mapping[str, int]) -> None:
        """Record, in one transaction, that these committed episodes are published at these indices."""
        now = time.time()
        with self._tx() as db:
            for episode_id, index in dataset_indices.items():
                cur = db.execute("UPDATE attempts SET state = 'exported', dataset_index = ?, updated_at = ? "
                                 "WHERE episode_id = ? AND state = 'committed'", (index, now, episode_id))
                if cur.rowcount != 1:
                    raise CatalogError(f"cannot mark {episode_id} exported: it is not a committed episode")

    def log_recovery(self, action: str, detail: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO recovery (at, action, detail) VALUES (?, ?, ?)", (time.time(), action, detail))

    # ------------------------------------------------------------------------------ reads
    _COLUMNS = ("episode_index, attempt, episode_id, state, seed, frames, video_bytes, content_hash, "
                "terminal_reason, reason, counted, record, dataset_index")

    @staticmethod
    def _row(r: tuple[Any, ...]) -> AttemptRow:
        return AttemptRow(episode_index=r[0], attempt=r[1], episode_id=r[2], state=r[3], seed=r[4], frames=r[5],
                          video_bytes=json.loads(r[6]) if r[6] else {}, content_hash=r[7], terminal_reason=r[8],
                          reason=r[9], counted=bool(r[10]), record=json.loads(r[11]) if r[11] else None,
                          dataset_index=r[12])

    def attempts(self, states: tuple[str, ...] | None = None) -> list[AttemptRow]:
        sql = f"SELECT {self._COLUMNS} FROM attempts"
        args: tuple[Any, ...] = ()
        if states:
            sql += f" WHERE state IN ({', '.join('?' * len(states))})"
            args = tuple(states)
        return [self._row(r) for r in self._query(sql + " ORDER BY episode_index, attempt, id", args)]

    def committed(self) -> list[AttemptRow]:
        return self.attempts(("committed", "exported"))

    def resume_state(self) -> ResumeState:
        committed = {r[0] for r in self._query(
            "SELECT episode_index FROM attempts WHERE state IN ('committed', 'exported')")}
        quarantined = {r[0] for r in self._query("SELECT episode_index FROM attempts WHERE state = 'quarantined'")}
        spent = dict(self._query("SELECT episode_index, COUNT(*) FROM attempts WHERE state = 'discarded' "
                                 "AND counted = 1 GROUP BY episode_index"))
        return ResumeState(frozenset(committed), spent, frozenset(quarantined))

    def referenced_episode_ids(self) -> set[str]:
        return {r[0] for r in self._query("SELECT episode_id FROM attempts WHERE state IN "
                                          "('staging', 'committed', 'quarantined', 'exported')")}

    def summary(self) -> dict[str, Any]:
        by_state = Counter(dict(self._query("SELECT state, COUNT(*) FROM attempts GROUP BY state")))
        reasons = Counter({k or "?": v for k, v in self._query(
            "SELECT terminal_reason, COUNT(*) FROM attempts WHERE state = 'discarded' GROUP BY terminal_reason")})
        frames = self._query("SELECT COALESCE(SUM(frames), 0) FROM attempts WHERE state IN ('committed', 'exported')")
        recovery = [{"at": at, "action": a, "detail": d}
                    for at, a, d in self._query("SELECT at, action, detail FROM recovery ORDER BY id")]
        return {"attempts_by_state": dict(by_state), "discarded_by_reason": dict(reasons),
                "committed_frames": int(frames[0][0]), "recovery": recovery}
