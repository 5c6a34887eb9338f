"""What must hold of a store after any crash and resume: the one set of invariants both kill harnesses check.

``tests/test_crash.py`` (a dozen kills in CI) and ``tools/crash_campaign.py`` (long campaigns across generate,
export and the daemon) both take a :func:`snapshot` right after a kill and call :func:`check_resumed_store`
after the resume; each violated invariant comes back under its name in :data:`STORE_INVARIANTS`, so a
failure reads the same in both places.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from demoforge.storage.catalog import AttemptRow
from demoforge.storage.paths import CATALOG_FILE
from demoforge.storage.store import open_store
from demoforge.storage.schema import AttemptState
from demoforge.storage.staging import staged_episode_ids, staged_episode_path

#: (attempt, seed, frames, content hash) of one committed episode index: what a clean run fixes.
Identity = tuple[int, int, int | None, str | None]

STORE_INVARIANTS: dict[str, str] = {
    "committed_kept": "episodes committed at the kill are still committed, same content hash and staged bytes",
    "matches_clean_run": "each episode index has the clean run's attempt, seed, frame count and content hash",
    "no_duplicates": "one committed attempt per episode index",
    "no_index_gaps": "committed indices are 0..N-1",
    "final_count": "N episodes committed after the resume",
    "no_leftovers": "no staging rows, orphan episode folders or *.partial files after the resume",
    "store_verifies": "verify_store: chunk checksums, counts, content hashes, decoded video frame counts",
}


@dataclass(frozen=True)
class StoreSnapshot:
    """The committed episodes of a store at one moment: their catalog rows and the digests of their files."""

    rows: Mapping[str, AttemptRow] = field(default_factory=dict)
    files: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def committed(self) -> int:
        return len(self.rows)


def attempt_rows(store: Path) -> list[AttemptRow] | None:
    """Every attempt in the order it was added, read-only (works while a writer runs). None before the
    catalog exists or while a process that is creating it leaves it unreadable."""
    if not (Path(store) / CATALOG_FILE).exists():
        return None
    try:
        with open_store(store) as view:
            return sorted(view.attempts(), key=lambda r: r.row_id)
    except Exception:  # a catalog a killed or starting process is creating right now: read it again later
        return None


def committed_rows(rows: list[AttemptRow] | None) -> list[AttemptRow]:
    return [r for r in rows or [] if r.state in (AttemptState.COMMITTED, AttemptState.EXPORTED)]


def identities(rows: list[AttemptRow] | None) -> dict[int, Identity]:
    return {r.episode_index: (r.attempt, r.seed, r.frames, r.content_hash) for r in committed_rows(rows)}


def staged_file_digests(store: Path, episode_ids: object) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for episode_id in episode_ids:  # type: ignore[attr-defined]
        base = staged_episode_path(store, episode_id)
        out[episode_id] = {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
                           for p in sorted(base.rglob("*")) if p.is_file()}
    return out


def snapshot(store: Path) -> StoreSnapshot:
    """What a kill must not take away: the committed rows and their staged bytes, taken right after it."""
    rows = {r.episode_id: r for r in committed_rows(attempt_rows(store))}
    return StoreSnapshot(rows, staged_file_digests(store, rows))


def check_committed_kept(before: StoreSnapshot, after: StoreSnapshot) -> list[str]:
    """Episodes committed in ``before`` that are gone or changed in ``after`` (empty when none)."""
    problems = []
    for episode_id, row in before.rows.items():
        now = after.rows.get(episode_id)
        if now is None:
            problems.append(f"{episode_id} was committed at the kill and is gone")
        elif (now.content_hash, now.frames) != (row.content_hash, row.frames):
            problems.append(f"{episode_id}: hash or frame count changed")
        elif after.files.get(episode_id) != before.files.get(episode_id):
            problems.append(f"{episode_id}: staged file bytes changed")
    return problems


def check_resumed_store(store: Path, *, target: int, before: StoreSnapshot | None = None,
                        reference: Mapping[int, Identity] | None = None) -> dict[str, list[str]]:
    """Check a store after its job was resumed to ``target``; invariant name -> violations (empty: all hold).

    ``before``: the snapshot taken right after the kill; ``reference``: a clean run's :func:`identities`."""
    store = Path(store)
    violations: dict[str, list[str]] = {}

    def bad(invariant: str, message: str) -> None:
        violations.setdefault(invariant, []).append(message)

    rows = attempt_rows(store) or []
    committed = committed_rows(rows)
    after = StoreSnapshot({r.episode_id: r for r in committed},
                          staged_file_digests(store, [i for i in (before.rows if before else {})
                                                      if i in {r.episode_id for r in committed}]))
    if before is not None:
        for problem in check_committed_kept(before, after):
            bad("committed_kept", problem)
    indices = [r.episode_index for r in committed]
    if len(indices) != len(set(indices)):
        bad("no_duplicates", f"committed episode indices repeat: {sorted(indices)}")
    if sorted(set(indices)) != list(range(len(set(indices)))):
        bad("no_index_gaps", f"committed episode indices {sorted(set(indices))}")
    if len(committed) != target:
        bad("final_count", f"{len(committed)} committed, target {target}")
    if reference is not None:
        got = identities(rows)
        differ = sorted(i for i in set(got) | set(reference) if got.get(i) != reference.get(i))
        if differ:
            bad("matches_clean_run", f"episode indices {differ} differ from the clean run: "
                                     + "; ".join(f"{i}: {got.get(i)} vs {reference.get(i)}" for i in differ[:3]))
    staging = [r.episode_id for r in rows if r.state == AttemptState.STAGING]
    folders = set(staged_episode_ids(store))
    kept = {r.episode_id for r in committed}
    partial = [str(p) for p in store.rglob("*.partial")]
    if staging or folders != kept or partial:
        bad("no_leftovers", f"staging rows {staging}, folders not committed {sorted(folders - kept)}, "
                            f"missing {sorted(kept - folders)}, partial files {partial[:3]}")
    with open_store(store) as view:
        report = view.verify()
    if not report.ok:
        bad("store_verifies", "; ".join(f"{p.episode_id}: {p.problem}" for p in report.problems)[:800])
    return violations
