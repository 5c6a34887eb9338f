"""The one writer of a dataset version: it starts it, is told what is written into it, ends it with the small
metadata files, publishes it, and removes it when anything fails on the way.

Export (``export.py``), edit, merge, split and trim (``edit.py``) and repair (``repair.py``) each decide what a
version holds and write its videos, data and episode rows into :attr:`VersionBuilder.path`; the builder owns
the rest, the same for all of them:

- **start**: ``NAME.versions/vNNNNNN.partial`` beside the published version (holding hard links to each of its
  files for an export that appends, empty for the others);
- **end**: the small files, rewritten whole, in one order: temporal proportions, tasks, ``stats.json``,
  ``info.json``, the sidecar rows, and last the marker (``meta/demoforge.json``) with every file's checksum
  (a file linked from a version that recorded its checksum keeps it; the rest are hashed);
- **publish**: every written file and every folder fsynced, the folder renamed to ``vNNNNNN``, the dataset's
  link swapped with one ``rename(2)`` (``publish.py``); readers see the old version or the new one;
- **clean up**: a version that leaves the builder unpublished (an error, a kill-free interruption, or nothing
  worth publishing) is removed at once, a renamed one not yet linked included: its space comes back now, not
  at the next run (``publish.remove_unfinished`` clears what a killed process left).

The builder reaches the :class:`~demoforge.storage.faults.ExportStep` steps on the way (a watching parent's
progress; the kill tests' moments). :class:`PathBuilder` is its sibling for a dataset that is one new path
rather than a version (a conversion, a repaired LeRobot dataset): written beside the target, then renamed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from demoforge.storage.durable import FsyncPool, fsync_dir
from demoforge.storage.faults import ExportStep, StepObserver, reach
from demoforge.storage.lerobot.files import write_stats_file, write_tasks
from demoforge.storage.lerobot.format import INFO, MARKER, SIDECAR, ExportMarker, FileChecksum, file_checksum
from demoforge.storage.lerobot.publish import (
    Published,
    append_jsonl,
    atomic_link,
    start_version,
    version_name,
    write_json,
)
from demoforge.storage.lerobot.subtasks import write_temporal_proportions
from demoforge.storage.write_errors import writing

__all__ = ["PathBuilder", "VersionBuilder", "VersionMetadata", "end_version", "fsync_tree"]

EpisodeStatistics = Mapping[str, Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class VersionMetadata:
    """What the small files that end a version say (the builder writes them, in their order)."""

    tasks: Mapping[str, int]  # task -> index: meta/tasks.parquet
    episode_stats: Sequence[EpisodeStatistics]  # the new episodes' statistics, aggregated into stats.json
    info: Mapping[str, Any]  # meta/info.json, whole
    marker: ExportMarker  # meta/demoforge.json; its ``files`` are the builder's: every file's checksum
    sidecar: Sequence[Mapping[str, Any]] = ()  # rows added to meta/demoforge_episodes.jsonl (none: not written)
    stats_of_published: bool = False  # an export appending: the published stats.json is aggregated in too


class VersionBuilder:
    """One new version of a dataset, used as a context manager: published inside it, or removed when it ends.

    ``link_current``: start with hard links to every file of the published version (an export appends to it).
    ``name_write_errors``: an OS write failure inside leaves as a ``StorageWriteError`` naming the version (off
    for a caller that words its own). ``on_step``: told each step reached (a watching parent's progress)."""

    def __init__(self, target: Published, number: int, *, link_current: bool = False,
                 name_write_errors: bool = True, on_step: StepObserver | None = None) -> None:
        self.target, self.number = target, number
        self.name = version_name(number)
        self.path = target.versions / f"{self.name}.partial"
        self._link_current = link_current
        self._on_step = on_step
        self._errors: AbstractContextManager[Any] = writing(f"the new dataset version {self.name}", self.path) \
            if name_write_errors else nullcontext()
        self._written: dict[Path, None] = {}  # in the order written (fsynced at publish)
        self._recorded: dict[str, FileChecksum | None] = {}  # relative path -> checksum where it was linked from
        self._published = False

    # ------------------------------------------------------------------------------ start and end
    def __enter__(self) -> VersionBuilder:
        start_version(self.target, self.number, link_current=self._link_current)
        try:
            self._errors.__enter__()
            if self._link_current:
                old = self.target.marker
                if self.target.current is not None and old is not None:
                    self._recorded.update(old.files)
                self.reach(ExportStep.AFTER_LINKS)
        except BaseException:
            self._remove_unpublished()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._errors.__exit__(exc_type, exc, tb)  # raises an OS write failure named; never swallows one
        finally:
            if not self._published:
                self._remove_unpublished()

    def _remove_unpublished(self) -> None:
        for leftover in (self.path, self.path.with_name(self.name)):
            if leftover.exists() and leftover != self.target.current:
                shutil.rmtree(leftover, ignore_errors=True)  # give the space back now, not at the next run

    # ------------------------------------------------------------------------------ filling
    def reach(self, step: ExportStep) -> None:
        """The caller's writing got to ``step`` (``after_videos``, ``after_data``)."""
        reach(step, self._on_step)

    def wrote(self, *paths: Path) -> None:
        """These files inside the version were written (or rewritten) now: fsynced at publish, hashed."""
        for path in paths:
            self._written[path] = None
            self._recorded.pop(path.relative_to(self.path).as_posix(), None)

    def linked(self, path: Path, checksum: FileChecksum | None) -> None:
        """This file inside the version is a hard link to a durable file whose checksum ``checksum`` records
        (None: not recorded; hashed at the end)."""
        self._recorded[path.relative_to(self.path).as_posix()] = checksum

    # ------------------------------------------------------------------------------ publishing
    def publish(self, meta: VersionMetadata) -> ExportMarker:
        """Write the small files and the marker, fsync, rename into place and swap the dataset's link. Returns
        the marker published."""
        marker = self._end(meta)
        self.reach(ExportStep.BEFORE_FSYNC)
        with FsyncPool() as pool:  # one batch for the version
            pool.fsync_all(self._written, [Path(dirpath) for dirpath, _dirs, _files in os.walk(self.path)])
        final = self.path.with_name(self.name)
        os.rename(self.path, final)
        fsync_dir(self.target.versions)
        self.reach(ExportStep.BEFORE_PUBLISH)  # renamed into place, the link not yet swapped
        atomic_link(self.target.root, os.path.relpath(final, self.target.root.parent))
        self._published = True
        self.reach(ExportStep.AFTER_PUBLISH)
        return marker

    def _end(self, meta: VersionMetadata) -> ExportMarker:
        marker, written = end_version(self.path, meta, self._recorded)
        self.wrote(*written)
        return marker


def end_version(build: Path, meta: VersionMetadata, recorded: Mapping[str, FileChecksum | None] | None = None
                ) -> tuple[ExportMarker, list[Path]]:
    """Write the small files that end a dataset at ``build``, in their order, the marker last with every file's
    checksum: ``recorded``'s for a file linked from where its checksum was recorded (relative path -> checksum),
    a hash for the others. Returns the marker and the files written. (A :class:`VersionBuilder` calls it; a
    repair that writes a plain folder, not a version, too.)"""
    written = [*write_temporal_proportions(build), *write_tasks(build, meta.tasks),
               write_stats_file(build, meta.episode_stats, meta.stats_of_published),
               write_json(build / INFO, dict(meta.info))]
    if meta.sidecar:
        written.append(append_jsonl(build / SIDECAR, meta.sidecar))
    known = dict(recorded or {})
    for path in written:
        known.pop(path.relative_to(build).as_posix(), None)  # rewritten: hashed
    marker = dataclasses.replace(meta.marker, files=_checksums(build, known))
    written.append(write_json(build / MARKER, marker.to_json()))
    return marker, written


def _checksums(build: Path, recorded: Mapping[str, FileChecksum | None]) -> dict[str, FileChecksum]:
    """Every file of the dataset at ``build`` but its marker: the checksum recorded where it was linked from, else
    its hash now."""
    out: dict[str, FileChecksum] = {}
    for dirpath, _dirs, names in os.walk(build):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(build).as_posix()
            if rel == MARKER:
                continue
            known = recorded.get(rel)
            out[rel] = known if known is not None else file_checksum(path)
    return out


class PathBuilder:
    """A dataset that is one new path (a folder or a file): written at ``partial`` beside ``target``, then
    renamed into place, so a reader finds nothing or all of it. Used as a context manager: the partial path is
    removed when it ends unpublished."""

    def __init__(self, target: Path, partial: Path, *, on_step: StepObserver | None = None) -> None:
        self.target, self.path = target, partial
        self._on_step = on_step
        self._published = False

    def __enter__(self) -> PathBuilder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._published:
            return
        if self.path.is_dir():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)

    def publish(self, before_rename: Callable[[], None] | None = None) -> None:
        """fsync everything written, then rename it to the target (``before_rename`` runs just before: a repair
        in place moves the broken dataset out of the way there)."""
        reach(ExportStep.BEFORE_FSYNC, self._on_step)
        fsync_tree(self.path)
        reach(ExportStep.BEFORE_PUBLISH, self._on_step)
        if before_rename is not None:
            before_rename()
        os.rename(self.path, self.target)
        self._published = True
        fsync_dir(self.target.parent)


def fsync_tree(path: Path) -> None:
    """Every file, then every folder, under ``path`` (or the file ``path``) on disk: one concurrent batch."""
    if path.is_file():
        with FsyncPool() as pool:
            pool.fsync_all([path])
        return
    walked = list(os.walk(path))
    with FsyncPool() as pool:
        pool.fsync_all([Path(folder) / name for folder, _dirs, files in walked for name in files],
                       [Path(folder) for folder, _dirs, _files in walked])
