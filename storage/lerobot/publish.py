"""Publishing dataset versions atomically: ``OUT`` is a symbolic link to ``OUT.versions/vNNNNNN``.

An export builds the next version beside the published one (:func:`start_version`: hard links to every
file of the current version), replaces the files it changes without ever writing through a shared link
(:func:`replace_file`), then the version builder (``storage/lerobot/version_builder.py``) fsyncs it, renames
``vNNNNNN.partial`` to ``vNNNNNN`` and swaps the link with one ``rename(2)`` (:func:`atomic_link`). LeRobot's
reader globs whole folders, so renaming files one at a time into a live folder could never be atomic for
readers; swapping a link is. A crash leaves the old version published; :func:`remove_unfinished` clears what
it left before the next export. One export at a time per dataset (:func:`lock_exports`); the newest
:data:`KEEP_VERSIONS` are kept.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demoforge.storage.durable import fsync_dir, make_dirs
from demoforge.storage.lerobot.format import INFO, MARKER, ExportMarker, MarkerError
from demoforge.storage.locks import try_lock
from demoforge.storage.paths import path_problem, short_path

KEEP_VERSIONS = 2
VERSIONS_SUFFIX = ".versions"
EXPORT_LOCK = "export.lock"


class ExportError(RuntimeError):
    """The export cannot proceed; nothing was modified."""


class NotOurDatasetError(ExportError):
    """The target exists and is not a dataset written by demoforge."""


def versions_dir(out: Path) -> Path:
    return out.parent / f"{out.name}{VERSIONS_SUFFIX}"


def version_name(number: int) -> str:
    return f"v{number:06d}"


@dataclass
class Published:
    """The currently published version of a dataset (or nothing yet)."""

    root: Path
    versions: Path
    current: Path | None
    marker: ExportMarker | None


def resolve_target(out: Path) -> Published:
    """What ``out`` holds now; refuses a path that cannot be a dataset and a dataset demoforge did not write."""
    out = Path(out)
    problem = path_problem(out, reserve=len(VERSIONS_SUFFIX))
    if problem:
        raise ExportError(f"cannot use {short_path(out)} as a dataset: the path {problem}")
    try:
        return _resolve_target(out)
    except OSError as exc:  # e.g. a path component that is a file, a loop of links, no permission
        raise ExportError(f"cannot use {short_path(out)} as a dataset: {exc.strerror or exc}") from None
    except (ValueError, MarkerError) as exc:  # an unreadable meta/demoforge.json
        raise NotOurDatasetError(f"{short_path(out)}: its {MARKER} cannot be read ({exc}); refusing to modify it") \
            from None


def _resolve_target(out: Path) -> Published:
    versions = versions_dir(out)
    if out.is_symlink():
        current = (out.parent / os.readlink(out)).resolve()
        if current.parent != versions.resolve() or not (current / MARKER).exists():
            raise NotOurDatasetError(f"{out} links to {current}, which is not a demoforge dataset version")
        return Published(out, versions, current, ExportMarker.read(current))
    if out.exists():
        if not out.is_dir():
            raise NotOurDatasetError(f"{out} exists and is not a directory")
        if (out / INFO).exists():
            raise NotOurDatasetError(f"{out} is a LeRobot dataset not written by demoforge; refusing to modify it "
                                     "(export to a new directory)")
        if any(out.iterdir()):
            raise NotOurDatasetError(f"{out} is a non-empty directory that is not a demoforge dataset; "
                                     "refusing to write into it")
    return Published(out, versions, None, None)


def check_writable(parent: Path) -> None:
    try:
        make_dirs(parent)  # fsynced into their parents: the dataset's link and versions live here
    except OSError as exc:
        raise ExportError(f"cannot create {parent}: {exc.strerror}") from exc
    probe = parent / f".demoforge-write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ExportError(f"cannot write to {parent}: {exc.strerror}") from exc


def lock_exports(versions: Path) -> int:
    """Hold the dataset's export lock (one exporting process at a time); close the fd to release it."""
    versions.mkdir(parents=True, exist_ok=True)
    fd = try_lock(versions / EXPORT_LOCK)
    if fd is None:
        raise ExportError(f"another export into {versions.parent} is running")
    return fd


def remove_unfinished(versions: Path, current: Path | None) -> None:
    for path in versions.glob("*.partial"):
        shutil.rmtree(path, ignore_errors=False)
    # A version renamed into place whose link swap never happened (a crash between the two) was never
    # published; left there, it would block this export's rename of the same version number forever.
    for path in versions.glob("v*"):
        if path.is_dir() and (current is None or path.name > current.name):
            shutil.rmtree(path)
    for path in versions.glob(".link-*"):
        path.unlink()


def unfinished_leftovers(versions: Path) -> list[str]:
    """Names a crashed export left behind (partial versions, temporary links); empty after a clean export."""
    return sorted(p.name for p in versions.iterdir() if p.name.endswith(".partial") or p.name.startswith(".link-"))


def finished_versions(versions: Path) -> list[Path]:
    return sorted(p for p in versions.glob("v*") if p.is_dir() and not p.name.endswith(".partial"))


def prune_versions(versions: Path, keep: int = KEEP_VERSIONS) -> None:
    for old in finished_versions(versions)[:-keep]:
        shutil.rmtree(old)


def start_version(target: Published, number: int, *, link_current: bool = True) -> Path:
    """Create ``vNNNNNN.partial`` holding hard links to every file of the published version (an export adds
    to it; ``link_current=False``: empty, for an edit that decides file by file what it keeps)."""
    build = target.versions / f"{version_name(number)}.partial"
    build.mkdir(parents=True)
    if target.current is not None and link_current:
        for dirpath, _dirs, files in os.walk(target.current):
            rel = Path(dirpath).relative_to(target.current)
            (build / rel).mkdir(parents=True, exist_ok=True)
            for name in files:
                os.link(Path(dirpath) / name, build / rel / name)
    return build


def replace_file(path: Path, data: bytes) -> Path:
    """Write a file that may be a hard link shared with the published version: never write through it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def unlink_shared(path: Path) -> None:
    """Remove a file that may be a hard link to the published version before a library rewrites it."""
    if path.exists():
        path.unlink()


def write_json(path: Path, obj: Any) -> Path:
    return replace_file(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def append_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    old = path.read_bytes() if path.exists() else b""
    new = "".join(json.dumps(r, allow_nan=False, sort_keys=True) + "\n" for r in rows).encode()
    return replace_file(path, old + new)


def atomic_link(link: Path, target_name: str) -> None:
    tmp = link.parent / f".link-{link.name}-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target_name, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)
