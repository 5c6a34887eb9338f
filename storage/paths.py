"""The names of a store's files (one place for them), and the path limits checked before anything is created.

A dataset's file names are LeRobot's: storage/lerobot/format.py."""

from __future__ import annotations

import os
from pathlib import Path

NAME_MAX = 255  # bytes in one path component (Linux filesystems)
PATH_MAX = 4096  # bytes in a whole path, the terminating NUL included
LOCK_FILE = "writer.lock"  # the writer's flock (storage/locks.py)
CATALOG_FILE = "catalog.sqlite"  # attempts, their states and the job (storage/catalog.py)
STAGING_DIR = "staging.zarr"  # the staged episodes (storage/staging.py)
EPISODES_DIR = "episodes"  # under STAGING_DIR: one folder per staged attempt


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
