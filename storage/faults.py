"""Every fault-injection hook, read here and nowhere else: for tests and the tools/ harnesses, unset in normal runs.

The hooks are one :class:`Faults` object, built from the environment by :func:`active` (the one place product
code asks) and :data:`NO_FAULTS`, which does nothing, when the environment sets none; no product signature
carries a hook (tests/test_architecture.py holds that). What the environment can ask:

- ``DEMOFORGE_STAGE_DELAY`` (e.g. ``"write:0.02,commit:0.3"``): seconds to sleep per frame in a stage, and
  between the fsync and the catalog flip of every commit, so a kill can land in that window; with
  ``DEMOFORGE_WINDOW_MARKS=FILE`` each commit writes its episode id to FILE as its window opens (the moment a
  test kills).
- ``DEMOFORGE_ATTEMPT_MARKS=FILE``: the write stage appends ``frames EPISODE_ID WORKER`` to FILE when an attempt's
  first frame reaches it and ``ended EPISODE_ID`` when its end does: a test kills while an attempt is mid-episode.
- ``DEMOFORGE_EXPORT_PAUSE`` / ``DEMOFORGE_EXPORT_HANG`` / ``DEMOFORGE_EXPORT_HANG_ONCE``: sleep at each
  :class:`ExportStep` of an export, edit, merge, repair or conversion, or block at one; the hang creates its file
  when it blocks, which is the moment a test kills it.
- ``DEMOFORGE_PRUNE_PAUSE``: seconds between two deletions of a prune.
- ``DEMOFORGE_FREE_SPACE_FILE``: a file holding the free space (MB) the daemon's disk check reports.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("step", "encode", "write", "commit")


class ExportStep(enum.Enum):
    """The named moments of writing a dataset (a version, or a conversion's new path), in the order they come: a
    watching parent counts them as progress (pipeline/export_child.py) and the kill tests stop a process at them."""

    AFTER_LINKS = "after_links"  # an export's new version holds links to every file of the published one
    AFTER_VIDEOS = "after_videos"  # the video files are written (a conversion: one more episode written)
    AFTER_DATA = "after_data"  # the data files are written
    BEFORE_FSYNC = "before_fsync"  # every file written, none fsynced yet
    BEFORE_PUBLISH = "before_publish"  # renamed into place, the dataset's link not swapped yet
    AFTER_PUBLISH = "after_publish"  # published
    BEFORE_CATALOG = "before_catalog"  # an export: published, the stores' catalogs not told yet
    AFTER_CATALOG = "after_catalog"
    AFTER_REPORT = "after_report"  # ``demoforge export`` printed its report


EXPORT_STEPS = tuple(step.value for step in ExportStep)

StepObserver = Callable[[ExportStep], None]


def stage_delays(spec: str | None = None) -> Mapping[str, float]:
    """``DEMOFORGE_STAGE_DELAY`` (or ``spec``) as stage -> seconds; ValueError names a bad entry."""
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


def _export_hang(spec: str | None) -> tuple[ExportStep, int] | None:
    """``DEMOFORGE_EXPORT_HANG``: ``STEP`` (the first time it is reached) or ``STEP#N`` (the N-th)."""
    if spec is None:
        return None
    name, _, nth = spec.partition("#")
    if name not in EXPORT_STEPS or (nth and not nth.isdigit()):
        raise ValueError(f"DEMOFORGE_EXPORT_HANG is {spec!r}: expected STEP or STEP#N; steps: "
                         f"{', '.join(EXPORT_STEPS)}")
    return ExportStep(name), int(nth or 1)


@dataclass(frozen=True)
class FaultSettings:
    """What the environment asks for (all unset: no fault)."""

    stage_delays: Mapping[str, float] = field(default_factory=dict)
    window_marks: str | None = None
    export_pause_s: float = 0.0
    export_hang: tuple[ExportStep, int] | None = None  # the step, and which time it is reached
    export_hang_once: str | None = None

    @classmethod
    def from_environment(cls) -> FaultSettings:
        raw = os.environ.get("DEMOFORGE_EXPORT_PAUSE")
        return cls(stage_delays=stage_delays(), window_marks=os.environ.get("DEMOFORGE_WINDOW_MARKS") or None,
                   export_pause_s=float(raw) if raw else 0.0,
                   export_hang=_export_hang(os.environ.get("DEMOFORGE_EXPORT_HANG") or None),
                   export_hang_once=os.environ.get("DEMOFORGE_EXPORT_HANG_ONCE") or None)


class Faults:
    """The faults of one process. Its only state is how many times the hang's step was reached (``STEP#N``: an
    edit that publishes several datasets reaches ``after_publish`` once per dataset)."""

    def __init__(self, settings: FaultSettings | None = None) -> None:
        self.settings = settings or FaultSettings()
        self._reached = 0

    def delay(self, stage: str) -> float:
        """Seconds a stage sleeps per record (0: none)."""
        return self.settings.stage_delays.get(stage, 0.0)

    def commit_window(self, episode_id: str) -> None:
        """Inside a commit, between its fsync and its catalog flip: with a ``commit`` delay, note the moment
        (``DEMOFORGE_WINDOW_MARKS``) so a test can kill in it rather than guess it, then sleep."""
        seconds = self.delay("commit")
        if not seconds:
            return
        if self.settings.window_marks:
            with open(self.settings.window_marks, "a") as file:
                file.write(f"{episode_id}\n")
        time.sleep(seconds)

    def pause(self, step: ExportStep) -> None:
        """At an export step: sleep ``DEMOFORGE_EXPORT_PAUSE`` seconds; block forever at the step
        ``DEMOFORGE_EXPORT_HANG`` names (with ``DEMOFORGE_EXPORT_HANG_ONCE=FILE``, only while FILE does not exist;
        the hang creates it, so a test knows the moment it blocks and the next run goes through)."""
        settings = self.settings
        if settings.export_pause_s:
            time.sleep(settings.export_pause_s)
        if settings.export_hang is None or step != settings.export_hang[0]:
            return
        self._reached += 1
        once = settings.export_hang_once
        if self._reached == settings.export_hang[1] and not (once and os.path.exists(once)):
            if once:
                open(once, "w").close()
            while True:
                time.sleep(3600)


NO_FAULTS = Faults()
_active = NO_FAULTS


def active() -> Faults:
    """The faults this process's environment asks for (:data:`NO_FAULTS` when it asks none). The same object while
    the environment stays the same, so a hang's ``#N`` counts across every dataset one command writes."""
    global _active
    settings = FaultSettings.from_environment()
    if settings != _active.settings:
        _active = Faults(settings) if settings != NO_FAULTS.settings else NO_FAULTS
    return _active


def reach(step: ExportStep, observer: StepObserver | None = None) -> None:
    """A writer of a dataset got to ``step``: tell ``observer`` (a watching parent's progress), then apply the
    faults asked for at it."""
    if observer is not None:
        observer(step)
    active().pause(step)


def attempt_marks() -> Callable[[str], None] | None:
    """With ``DEMOFORGE_ATTEMPT_MARKS=FILE``, a function appending one line to FILE (None when unset)."""
    marks = os.environ.get("DEMOFORGE_ATTEMPT_MARKS")
    if not marks:
        return None

    def mark(line: str) -> None:
        with open(marks, "a") as file:
            file.write(f"{line}\n")

    return mark


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
