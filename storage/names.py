"""Names a task gives its cameras and state features: they become folder and file names in a store and a
dataset (staging arrays, video paths), so each is checked to be one safe path component before anything is
written, whether it comes from a task (pipeline/tasks/registry.py) or from a stored fingerprint."""

from __future__ import annotations

import re


class TaskDefinitionError(ValueError):
    """A task describes something a job cannot store: an unsafe camera or feature name, or sizes beyond the
    job limits (refused before anything is allocated or written)."""


# One path component of safe characters, never ".." or a hidden name.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a safe camera / feature name, else raise :class:`TaskDefinitionError`."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise TaskDefinitionError(f"{kind} name {name!r} is not allowed: use 1-64 characters of A-Z a-z 0-9 _ . - "
                                  "starting with a letter, digit or underscore, without '..'")
    return name
