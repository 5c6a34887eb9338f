"""Turn an OS error while writing (a full disk, most often) into the few lines a person needs: what was being
written, where, how much space is free, what is safe, and how to go on. Shared by the CLI and the daemon."""

from __future__ import annotations

import argparse
from pathlib import Path

from demoforge.storage.write_errors import (
    StorageWriteError,
    free_bytes,
    human_bytes,
    is_disk_full,
    is_not_permitted,
)

EXIT_WRITE_FAILED = 4  # an OS error while writing (full disk, I/O error, read-only filesystem)


def failed_write(exc: BaseException) -> tuple[str, Path | None, str]:
    """(what was being written, where, the OS's reason) of a write error."""
    if isinstance(exc, StorageWriteError):
        return exc.what, exc.path, exc.strerror or str(exc)
    filename = getattr(exc, "filename", None)
    reason = getattr(exc, "strerror", None) or str(exc)
    return "a file", Path(filename) if filename else None, reason


def committed_in(store: Path | None) -> int | None:
    """Committed episodes of a store, read without the lock (None if it cannot be read)."""
    if store is None:
        return None
    try:
        from demoforge.storage.store import open_store

        with open_store(store) as view:
            return len(view.committed())
    except Exception:  # noqa: BLE001 - only an extra detail of the message
        return None


def store_safety(store: Path | None) -> str:
    count = committed_in(store)
    episodes = f"the {count} committed episode(s)" if count is not None else "committed episodes"
    return (f"{episodes} in {store} are complete and intact (each was fsynced before it was committed); "
            "the unfinished attempts' files were removed")


def describe_write_failure(command: str, exc: BaseException, args: argparse.Namespace) -> str:
    what, where, reason = failed_write(exc)
    stores = getattr(args, "store", None)
    stores = stores if isinstance(stores, list) else [stores] if stores is not None else []  # export: several
    store = stores[0] if stores else None
    fallback = getattr(args, "out", None) if command == "export" else store
    free = free_bytes(where or fallback or Path("."))
    cause = "the disk is full" if is_disk_full(exc) else reason
    denied = is_not_permitted(exc)
    remedy = ("make that folder writable for this user (or choose another output)" if denied
              else "free some space on that filesystem")
    lines = [f"demoforge {command}: error: {cause} ({reason}) while writing {what}",
             f"  where: {where or fallback or 'unknown path'}; {human_bytes(free)} free on that filesystem"]
    if command == "generate":
        lines.append(f"  safe: {store_safety(store)}")
        lines.append(f"  next: {remedy}, then re-run the same command: it resumes where it stopped")
    elif command == "export":
        lines.append(f"  safe: the published dataset {args.out} is unchanged and its unfinished new version was "
                     f"removed; the store(s) {', '.join(str(s) for s in stores)} untouched")
        lines.append(f"  next: {remedy}, then run the same export again")
    else:
        lines.append("  safe: data committed before this error is intact")
        lines.append(f"  next: {remedy}, then run the same command again")
    lines.append("  (exit status 4; add --debug for the traceback)")
    return "\n".join(lines)
