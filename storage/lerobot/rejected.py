"""Episodes a reviewer rejected in ``demoforge view``: a small list file next to the dataset, never inside it.

``runs/fetch-dataset`` -> ``runs/fetch-dataset.rejected.json``::

    {"format": 1, "rejected": [{"store_id": "...", "episode_id": "ep00000003-a00", "dataset_index": 3,
                                "version": "v000002", "marked_at": 1733050000.0}]}

An entry names its episode by what stays with it across edits (the store and staging episode of a demoforge
dataset); a dataset that records no such ids (one edited from a LeRobot dataset demoforge did not write)
names it by index, valid only in the version it was marked in. ``demoforge edit DATASET --delete-rejected``
deletes them and then drops the entries whose episodes are gone. Writes replace the file atomically, under a
lock, so the viewer and an edit never lose each other's changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from demoforge.storage.lerobot.publish import VERSIONS_SUFFIX

REJECTED_SUFFIX = ".rejected.json"
FORMAT = 1


class RejectedListError(ValueError):
    """The list file cannot be read (not JSON, another format) or names an episode that cannot be matched."""


@dataclass(frozen=True)
class Rejection:
    dataset_index: int  # at marking time, in ``version``
    version: str | None
    store_id: str | None = None
    episode_id: str | None = None
    marked_at: float = 0.0

    def key(self) -> tuple[Any, ...]:
        return ("id", self.store_id, self.episode_id) if self.episode_id is not None else \
            ("index", self.version, self.dataset_index)


def rejected_list_path(dataset: Path | str) -> Path:
    """The list beside ``dataset`` (the link a user names); a path inside ``X.versions/`` maps to ``X``'s."""
    dataset = Path(dataset)
    if dataset.parent.name.endswith(VERSIONS_SUFFIX):
        dataset = dataset.parent.with_name(dataset.parent.name.removesuffix(VERSIONS_SUFFIX))
    return dataset.with_name(dataset.name + REJECTED_SUFFIX)


def read_rejections(path: Path) -> list[Rejection]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        return [Rejection(int(e["dataset_index"]), e.get("version"), e.get("store_id"), e.get("episode_id"),
                          float(e.get("marked_at", 0.0))) for e in data["rejected"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RejectedListError(f"{path}: not a list of rejected episodes ({type(exc).__name__}: {exc}); fix or "
                                "remove it") from None


def _write(path: Path, entries: Sequence[Rejection]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    body = {"format": FORMAT, "rejected": [{k: v for k, v in asdict(e).items() if v is not None} for e in entries]}
    with open(tmp, "w") as f:
        f.write(json.dumps(body, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """A blocking lock beside the list (held for a read-modify-write, milliseconds)."""
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def set_rejected(path: Path, entry: Rejection, rejected: bool) -> list[Rejection]:
    """Add (``rejected``) or remove the entry for one episode; returns the list as written."""
    with _locked(path):
        entries = [e for e in read_rejections(path) if e.key() != entry.key()]
        if rejected:
            entries.append(entry if entry.marked_at else Rejection(**{**asdict(entry), "marked_at": time.time()}))
        _write(path, entries)
        return entries


def drop_rejections(path: Path, gone: Sequence[Rejection]) -> None:
    """Remove entries (those an edit applied) from the list; the file goes when it is left empty."""
    if not path.is_file():
        return
    keys = {e.key() for e in gone}
    with _locked(path):
        entries = [e for e in read_rejections(path) if e.key() not in keys]
        if entries:
            _write(path, entries)
        else:
            path.unlink()  # (the lock file stays: removing it could let two writers lock different files)
