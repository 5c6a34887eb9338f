"""Every fault-injection hook, read here and nowhere else: for tests and the tools/ harnesses, unset in normal runs.

- ``DEMOFORGE_STAGE_DELAY`` (e.g. ``"write:0.02,commit:0.3"``): seconds to sleep per frame in a stage, and
  between the fsync and the catalog flip of every commit, so a kill can land in that window; with
  ``DEMOFORGE_WINDOW_MARKS=FILE`` each commit writes its episode id to FILE as its window opens (the moment a
  test kills).
- ``DEMOFORGE_ATTEMPT_MARKS=FILE``: the write stage appends ``frames EPISODE_ID WORKER`` to FILE when an attempt's
  first frame reaches it and ``ended EPISODE_ID`` when its end does: a test kills while an attempt is mid-episode.
- ``DEMOFORGE_EXPORT_PAUSE`` / ``DEMOFORGE_EXPORT_HANG`` / ``DEMOFORGE_EXPORT_HANG_ONCE``: sleep at each step of an
  export, or block at one; the hang creates its file when it blocks, which is the moment a test kills it.
- ``DEMOFORGE_PRUNE_PAUSE``: seconds between two deletions of a prune.
- ``DEMOFORGE_FREE_SPACE_FILE``: a file holding the free space (MB) the daemon's disk check reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

STAGES = ("step", "encode", "write", "commit")


def stage_delays(spec: str | None = None) -> Mapping[str, float]:
    spec = os.environ.get("DEMOFORGE_STAGE_DELAY", "") if spec is None else spec
    delays: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        stage, _, seconds = item.partition(":")
        if stage not in STAGES:
            raise ValueError(f"DEMOFORGE_STAGE_DELAY names unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        try:
            delays[stage] = float(seconds)
        except ValueError:
            raise ValueError(f"DEMOFORGE_STAGE_DELAY: {item!r} is not STAGE:SECONDS") from None
    return delays


def window_pause(seconds: float, what: str) -> Callable[[], None]:
    """A pause of ``seconds`` inside a window a kill should land in (a commit's, between its fsync and its catalog
    flip); with ``DEMOFORGE_WINDOW_MARKS=FILE`` it first appends ``what`` to FILE, so a test can wait for the
    moment rather than guess it."""
    marks = os.environ.get("DEMOFORGE_WINDOW_MARKS")

    def pause() -> None:
        if marks:
            with open(marks, "a") as file:
                file.write(f"{what}\n")
        time.sleep(seconds)

    return pause


def attempt_marks() -> Callable[[str], None] | None:
    """With ``DEMOFORGE_ATTEMPT_MARKS=FILE``, a function appending one line to FILE (None when unset)."""
    marks = os.environ.get("DEMOFORGE_ATTEMPT_MARKS")
    if not marks:
        return None

    def mark(line: str) -> None:
        with open(marks, "a") as file:
            file.write(f"{line}\n")

    return mark


EXPORT_STEPS = ("after_links", "after_videos", "after_data", "before_fsync", "before_publish", "after_publish",
                "before_catalog", "after_catalog", "after_report")


def export_pause() -> Callable[[str], None] | None:
    """``DEMOFORGE_EXPORT_PAUSE=seconds`` sleeps at each step of an export, so a kill can land inside it.

    ``DEMOFORGE_EXPORT_HANG=STEP`` blocks the export forever at that step (a hung export, for the export
    watchdog's tests), ``STEP#N`` the N-th time it gets there (an edit that publishes several datasets); with
    ``DEMOFORGE_EXPORT_HANG_ONCE=FILE`` only while FILE does not exist (the hang creates it, so a test knows the
    moment it blocks), so the next export runs through."""
    raw = os.environ.get("DEMOFORGE_EXPORT_PAUSE")
    seconds = float(raw) if raw else 0.0
    hang_spec = os.environ.get("DEMOFORGE_EXPORT_HANG") or None
    hang_at, _, nth = (hang_spec or "").partition("#")
    if hang_spec is not None and (hang_at not in EXPORT_STEPS or (nth and not nth.isdigit())):
        raise ValueError(f"DEMOFORGE_EXPORT_HANG is {hang_spec!r}: expected STEP or STEP#N; steps: "
                         f"{', '.join(EXPORT_STEPS)}")
    reached_nth = int(nth or 1)
    reached = 0  # times the pause got to ``hang_at``
    once = os.environ.get("DEMOFORGE_EXPORT_HANG_ONCE")
    if not seconds and hang_spec is None:
        return None

    def pause(step: str) -> None:
        nonlocal reached
        if seconds:
            time.sleep(seconds)
        if step == hang_at:
            reached += 1
        if step == hang_at and reached == reached_nth and not (once and os.path.exists(once)):
            if once:
                open(once, "w").close()
            while True:
                time.sleep(3600)

    return pause


def prune_pause() -> float:
    """``DEMOFORGE_PRUNE_PAUSE``: seconds to sleep between two deletions of a prune (0: none)."""
    return float(os.environ.get("DEMOFORGE_PRUNE_PAUSE", "0") or 0)


def free_space_override() -> float | None:
    """``DEMOFORGE_FREE_SPACE_FILE``: the free space (MB) written in that file, for the daemon's disk check;
    None when unset or unreadable (the real free space is used)."""
    path = os.environ.get("DEMOFORGE_FREE_SPACE_FILE")
    if not path:
        return None
    try:
        return float(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None
