"""Export committed episodes of a staging store into a LeRobot v3.0 dataset, atomically and incrementally.

The exporter: which episodes go into a new version, in which order its files are written, and the sidecar and
marker that make it exactly-once. The files themselves (data parquet, per-camera mp4, episode metadata, stats,
tasks, info) are written by ``storage/lerobot/files.py``; the format is ``storage/lerobot/format.py``; the
version is started, ended, published (or removed) by ``storage/lerobot/version_builder.py``, as every version.

Exactly once: the published ``meta/demoforge.json`` lists every exported staging episode with its dataset
index; it is the truth, and the catalog's ``exported`` state is reconciled from it.

No re-encoding: each camera's staged fragmented-MP4 stream is remuxed (packet copy, timestamps shifted)
into the shared per-camera mp4 of this export.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demoforge.storage.catalog import AttemptRow
from demoforge.storage.faults import ExportStep, StepObserver, reach
from demoforge.storage.lerobot.files import (
    DataFileWriter,
    EpisodeMetaRow,
    VideoFileWriter,
    episode_frames,
    episode_stats,
    info_json,
    write_episode_meta,
)
from demoforge.storage.lerobot.format import (
    INFO,
    MARKER,  # noqa: F401  (demoforge/api.py reads a dataset's marker by this name)
    ExportMarker,
    PublishedEpisode,
    camera_key,
    dataset_features,
    schema_differences,
    schema_identity,
)
from demoforge.storage.lerobot.output_guard import output_overlap
from demoforge.storage.lerobot.publish import (
    KEEP_VERSIONS,
    ExportError,
    NotOurDatasetError,
    Published,
    check_writable,
    lock_exports,
    prune_versions,
    remove_unfinished,
    resolve_target,
)
from demoforge.storage.lerobot.subtasks import subtask_columns
from demoforge.storage.lerobot.version_builder import VersionBuilder, VersionMetadata
from demoforge.storage.schema import SCHEMA_VERSION
from demoforge.storage.schema import AttemptState, Fingerprint, check_include, included
from demoforge.storage.staging import StagedEpisode, StagingCorruptError, StagingStore
from demoforge.storage.store import Store, open_store
from demoforge.storage.store_verify import check_episode

__all__ = ["ExportError", "ExportReport", "NotOurDatasetError", "SchemaMismatchError", "export_store", "export_stores"]


class SchemaMismatchError(ExportError):
    """The target dataset was written for a different job (features, fps, codec)."""


@dataclass(frozen=True)
class ExportReport:
    dataset: Path
    version: str | None
    exported: int
    total_episodes: int
    total_frames: int
    quarantined: list[str]
    reconciled: int
    elapsed_s: float
    pruned_elsewhere: tuple[str, ...] = ()  # pruned episodes this dataset lacks: their staged data is gone
    removed_by_edit: tuple[str, ...] = ()  # episodes `demoforge edit` removed from the dataset: never added again
    left_out: int = 0  # committed episodes the dataset lacks that ``include`` does not take (kept failures, ...)


@dataclass(frozen=True)
class _Source:
    """One store an export reads: where it is, who it is, its job, and the store opened in mode r+."""

    path: Path
    store_id: str
    fingerprint: Fingerprint
    store: Store

    @property
    def staging(self) -> StagingStore:
        return self.store.require_job()[1]

    def origin(self) -> dict[str, Any]:
        """What the sidecar records of each episode's origin besides the staging episode: the store and the
        job (replay rebuilds the env from these task options and job seed)."""
        fp = self.fingerprint
        return {"store_id": self.store_id, "task_options": dict(fp.task_options), "job_seed": fp.seed}


def export_store(store_dir: Path | str, out: Path | str, **kwargs: Any) -> ExportReport:
    """Export every committed, not yet exported episode of ``store_dir`` into the dataset at ``out``."""
    return export_stores([store_dir], out, **kwargs)


def export_stores(stores: Sequence[Path | str], out: Path | str, *, repo_id: str | None = None,
                  progress: Callable[[int, int], None] | None = None, on_step: StepObserver | None = None,
                  on_published: Callable[[ExportReport], None] | None = None,
                  include: str = "episodes") -> ExportReport:
    """Export the committed, not yet exported episodes of every store in ``stores`` (in that order) into the
    dataset at ``out``, as one new version. Exactly once per (store id, staging episode).

    ``include`` (storage/schema.py INCLUDE_CHOICES): the job's episodes (the default), the failures
    ``generate --keep-failures`` kept, or all; a kept failure's sidecar record says so (``kept_failure``).

    Every store's features (cameras and sizes, fps, state and action shapes, codec settings) must equal the
    others' and the dataset's; otherwise nothing is written and SchemaMismatchError names the difference.
    Safe while generate jobs write the stores: each is opened with ``open_store(path, "r+")`` (states only:
    ``exported``, and ``quarantined`` for an episode that fails its checks). ``on_step(step)`` is told each
    :class:`ExportStep` reached (a watching parent counts them as progress); ``on_published(report)`` right
    after the new version is published, before the catalogs record it.
    """
    started = time.monotonic()
    out = Path(out)
    _check_request(stores, include)
    with contextlib.ExitStack() as opened:
        sources = [_open_source(Path(p), opened) for p in stores]
        target = _check_target(sources, out)
        lock_fd = lock_exports(target.versions)
        try:
            remove_unfinished(target.versions, target.current)
            marker = _attribute(target.marker, sources)
            reconciled = sum(_reconcile(source, marker) for source in sources)
            todo = _pending(sources, marker, include)
            check_free_space(out, [row for _source, row in todo.rows])  # before anything is written
            writer = _VersionWriter(target, marker, sources[0].fingerprint,
                                    repo_id or f"demoforge/{sources[0].fingerprint.task}", on_step)
            result = writer.write(_read_ahead(todo.rows), len(todo.rows), progress)
            if result is None:  # every pending episode failed its checks (or none was pending)
                return _report(out, target.current.name if target.current else None, marker, writer, reconciled,
                               todo, started)
            report = _report(out, result[0], result[1], writer, reconciled, todo, started)
            if on_published is not None:
                on_published(report)
            reach(ExportStep.BEFORE_CATALOG, on_step)
            for source in sources:
                source.store.mark_exported({row.episode_id: index for (src, row), index
                                            in zip(writer.exported, writer.new_indices)
                                            if src is source and row.state == AttemptState.COMMITTED})
            reach(ExportStep.AFTER_CATALOG, on_step)
            prune_versions(target.versions, keep=KEEP_VERSIONS)
            return dataclasses.replace(report, elapsed_s=time.monotonic() - started)
        finally:
            os.close(lock_fd)


def _check_request(stores: Sequence[Path | str], include: str) -> None:
    if not stores:
        raise ExportError("no store to export from")
    try:
        check_include(include)
    except ValueError as exc:
        raise ExportError(str(exc)) from None


def _check_target(sources: Sequence[_Source], out: Path) -> Published:
    """The dataset at ``out``, refused before anything is written: a path no dataset can have, one inside a
    store, features that differ, a folder that cannot be written; and the same store named twice."""
    _refuse_duplicate_stores(sources)
    target = resolve_target(out)  # first: it refuses a path no dataset can have (a NUL byte, too long)
    inside = output_overlap(out, {f"the store {n + 1}" if len(sources) > 1 else "the store": s.path
                                  for n, s in enumerate(sources)})
    if inside is not None:
        raise ExportError(f"--out {inside}: a dataset is written apart from the stores it is exported from; "
                          "nothing was written")
    _check_schemas(sources, target.marker, out)
    check_writable(out.parent)
    return target


@dataclass(frozen=True)
class _Pending:
    """The stores' committed episodes this export adds, and those it leaves out and why."""

    rows: list[tuple[_Source, AttemptRow]]
    gone: tuple[str, ...]  # pruned after an export elsewhere: their staged data is gone
    edited_out: tuple[str, ...]  # removed from the dataset by `demoforge edit`: never added again
    left_out: int  # not taken by ``include``


def _pending(sources: Sequence[_Source], marker: ExportMarker | None, include: str) -> _Pending:
    """What the dataset already holds is the published marker's word, not the catalog's: a store can feed a
    second dataset, and a crash can fall between publishing and the catalog update."""
    pending: list[tuple[_Source, AttemptRow]] = []
    gone: list[str] = []
    edited_out: list[str] = []
    left_out = 0
    for source in sources:
        present = set(marker.dataset_indices(source.store_id)) if marker else set()
        rows = [r for r in source.store.committed() if r.episode_id not in present]
        taken = [r for r in rows if included(include, r.kept_failure)]
        left_out += len(rows) - len(taken)
        removed = marker.removed_ids(source.store_id, legacy=len(sources) == 1) if marker else set()
        edited_out += [r.episode_id for r in taken if r.episode_id in removed]
        rows = [r for r in taken if r.episode_id not in removed]
        pruned = source.store.pruned_ids()  # exported earlier, staged data deleted: never read again
        gone += [r.episode_id for r in rows if r.episode_id in pruned]
        pending += [(source, r) for r in rows if r.episode_id not in pruned]
    return _Pending(pending, tuple(gone), tuple(edited_out), left_out)


def _report(out: Path, version: str | None, marker: ExportMarker | None, writer: _VersionWriter, reconciled: int,
            todo: _Pending, started: float) -> ExportReport:
    """The export's report; ``marker``: the dataset's marker now (the new one, or the one left published)."""
    return ExportReport(out, version, len(writer.exported), marker.total_episodes if marker else 0,
                        marker.total_frames if marker else 0, writer.quarantined, reconciled,
                        time.monotonic() - started, todo.gone, todo.edited_out, todo.left_out)


def _open_source(path: Path, opened: contextlib.ExitStack) -> _Source:
    store = opened.enter_context(open_store(path, "r+"))
    fingerprint = store.fingerprint  # refuses unsafe camera / feature names before any write
    if fingerprint is None or store.staging is None:
        raise ExportError(f"{path} holds no job yet; nothing to export")
    return _Source(path, store.ensure_store_id(), fingerprint, store)


def _refuse_duplicate_stores(sources: Sequence[_Source]) -> None:
    seen: dict[str, Path] = {}
    for source in sources:
        if source.store_id in seen:
            raise ExportError(f"{source.path} and {seen[source.store_id]} are the same store (id {source.store_id}: "
                              "a copy of a store keeps its id); name each store once")
        seen[source.store_id] = source.path


def _check_schemas(sources: Sequence[_Source], marker: ExportMarker | None, out: Path) -> None:
    """Refuse, before anything is written, stores whose features differ from each other or the dataset's."""
    first = sources[0]
    reference, reference_name = (dict(marker.schema), f"the dataset {out}") if marker else \
        (schema_identity(first.fingerprint), f"store {first.path}")
    for source in sources:
        diffs = schema_differences(reference, schema_identity(source.fingerprint), reference_name,
                                   f"store {source.path}")
        if diffs:
            raise SchemaMismatchError(f"cannot export {source.path} into {out}: its features differ ("
                                      + "; ".join(diffs) + "). A dataset holds one feature layout: export this "
                                      "store to another dataset; nothing was written")


def _attribute(marker: ExportMarker | None, sources: Sequence[_Source]) -> ExportMarker | None:
    """Give the entries of a marker written before stores had ids the id of the store they came from.

    Such a dataset was fed by one store. An entry is a source's when that store's catalog records the
    episode exported at the same dataset index; when the marker has only such entries and this export
    reads a single store, they are all that store's (the old single-store behaviour, which also covers a
    crash between publishing and the catalog update)."""
    if marker is None or all(e.store_id is not None for e in marker.episodes):
        return marker
    owners: dict[tuple[str, int], str] = {}
    for source in sources:
        for row in source.store.attempts((AttemptState.EXPORTED,)):
            if row.dataset_index is not None:
                owners[(row.episode_id, row.dataset_index)] = source.store_id
    only_legacy = all(e.store_id is None for e in marker.episodes)
    fallback = sources[0].store_id if only_legacy and len(sources) == 1 else None
    episodes = tuple(e if e.store_id is not None else
                     dataclasses.replace(e, store_id=owners.get((e.episode_id, e.dataset_index), fallback))
                     for e in marker.episodes)
    return dataclasses.replace(marker, episodes=episodes)


def _reconcile(source: _Source, marker: ExportMarker | None) -> int:
    """Make a store's catalog agree with the published dataset (a crash can fall between publish and catalog)."""
    if not marker:
        return 0
    published = marker.dataset_indices(source.store_id)
    pending = {r.episode_id: published[r.episode_id] for r in source.store.attempts((AttemptState.COMMITTED,))
               if r.episode_id in published}
    if pending:
        source.store.mark_exported(pending)
    return len(pending)


def _read_ahead(pending: Sequence[tuple[_Source, AttemptRow]]
                ) -> Iterator[tuple[_Source, AttemptRow, StagedEpisode | None]]:
    """Each pending episode read and checked while the writer writes the one before it (one reading thread,
    one episode ahead), so an export holds at most two episodes' data whatever the number pending. A
    corrupt one is quarantined (yielded as None: never exported)."""
    def read(source: _Source, row: AttemptRow) -> StagedEpisode | StagingCorruptError:
        try:
            return check_episode(source.staging, row, decode=False)
        except StagingCorruptError as exc:
            return exc

    with ThreadPoolExecutor(1, thread_name_prefix="export-read") as reader:
        ahead = reader.submit(read, *pending[0]) if pending else None
        for i, (source, row) in enumerate(pending):
            assert ahead is not None
            got = ahead.result()
            ahead = reader.submit(read, *pending[i + 1]) if i + 1 < len(pending) else None
            if isinstance(got, StagingCorruptError):
                source.store.quarantine(row.episode_id, f"export: {got}")  # the catalog: this thread only
                yield source, row, None
            else:
                yield source, row, got
            del got


def estimate_export_bytes(rows: Sequence[AttemptRow]) -> int:
    """A generous bound on what exporting these episodes adds to the dataset's filesystem: the remuxed video
    (the staged stream's size plus container overhead), the frame data (parquet of the numbers: bounded by
    twice the frames times a row's worth of columns), episode metadata, and the rewritten small files."""
    video = sum(sum(r.video_bytes.values()) for r in rows)
    frames = sum(int(r.frames or 0) for r in rows)
    return int(video * 1.05) + frames * 512 + len(rows) * 8192 + (4 << 20)


def check_free_space(out: Path, rows: Sequence[AttemptRow]) -> None:
    """Refuse to start an export the dataset's filesystem cannot hold (ExportError with the numbers)."""
    if not rows:
        return
    from demoforge.storage.write_errors import free_bytes, human_bytes

    needed = estimate_export_bytes(rows)
    free = free_bytes(out.parent)
    if free is not None and free < needed:
        raise ExportError(f"not enough free space to export {len(rows)} episode(s) into {out}: they need about "
                          f"{human_bytes(needed)} ({human_bytes(sum(sum(r.video_bytes.values()) for r in rows))} "
                          f"of video, {sum(int(r.frames or 0) for r in rows)} frames of data), and "
                          f"{human_bytes(free)} is free there; nothing was written. Free some space and run the "
                          "export again")


# ------------------------------------------------------------------------------------------- writing
class _VersionWriter:
    """What an export adds to the dataset's next version (the version itself is a :class:`VersionBuilder`'s):
    each good episode's video remuxed, its rows appended, its statistics, metadata row and sidecar record."""

    def __init__(self, target: Published, marker: ExportMarker | None, fingerprint: Fingerprint, repo_id: str,
                 on_step: StepObserver | None) -> None:
        self.target = target
        self.old = marker  # the published marker, its entries attributed to stores
        self.fp = fingerprint
        self.repo_id = repo_id
        self.on_step = on_step
        self.fps = int(fingerprint.fps)
        self.cameras = fingerprint.cameras
        # Outcome flags (next.success, next.done), unless appending to a version exported before them
        self.outcomes = marker is None or "next.done" in _published_features(target)
        self.features = dataset_features(fingerprint, outcomes=self.outcomes)
        self.new_indices: list[int] = []
        self.exported: list[tuple[_Source, AttemptRow]] = []
        self.quarantined: list[str] = []
        self.tasks: dict[str, int] = dict(marker.tasks) if marker else {}
        self.meta_rows: list[EpisodeMetaRow] = []  # small per-episode records (stats, indices): kept to the end
        self.sidecar: list[dict[str, Any]] = []
        self.frame = marker.total_frames if marker else 0  # the dataset's next frame index

    def write(self, episodes: Iterable[tuple[_Source, AttemptRow, StagedEpisode | None]], total: int,
              progress: Callable[[int, int], None] | None) -> tuple[str, ExportMarker] | None:
        """Build and publish the next version from ``episodes``, consumed one at a time: each is remuxed,
        its frames appended to the open parquet file, its stats computed, then dropped. Returns None when no
        episode was good (nothing published). On any error the unfinished version is removed at once."""
        old = self.old
        with VersionBuilder(self.target, (old.version if old else 0) + 1, link_current=True,
                            on_step=self.on_step) as version:
            cursors = self._add_all(version, episodes, total, progress)
            if not self.exported:
                return None  # the builder removes the version
            version.reach(ExportStep.AFTER_VIDEOS)
            meta_next, files = write_episode_meta(version.path, self.meta_rows, old.next_meta if old else (0, 0))
            version.wrote(*files)
            version.reach(ExportStep.AFTER_DATA)
            return version.name, version.publish(self._metadata(version.number, meta_next, *cursors))

    def _add_all(self, version: VersionBuilder, episodes: Iterable[tuple[_Source, AttemptRow, StagedEpisode | None]],
                 total: int, progress: Callable[[int, int], None] | None
                 ) -> tuple[tuple[int, int], dict[str, tuple[int, int]]]:
        """Every episode into the version's open video and data files; returns where the next data and video
        files start."""
        old = self.old
        build = version.path
        videos = {c.name: VideoFileWriter(build, camera_key(c.name), old.next_videos.get(c.name, (0, 0))
                                           if old else (0, 0), self.fps) for c in self.cameras}
        data = DataFileWriter(build, self.features, old.next_data if old else (0, 0))
        # Sub-task columns (subtasks.py), unless appending to a version exported before them: one schema per dataset
        with_subtasks = old is None or _has_subtask_columns(build)
        stats_cache: dict[tuple[str, bytes], Any] = {}
        try:
            done = 0
            for item in episodes:  # (no enumerate: its cached result tuple would keep the last episode alive)
                source, row, ep = item
                del item
                done += 1
                if ep is None:
                    self.quarantined.append(row.episode_id)
                else:
                    self._add(source, row, ep, videos, data, with_subtasks, stats_cache)
                    del ep
                if progress is not None:
                    progress(done, total)
        finally:
            video_cursors = {name: writer.close() for name, writer in videos.items()}
            data_next = data.close()
        for writer in videos.values():
            version.wrote(*writer.files)
        version.wrote(*data.files)
        return data_next, video_cursors

    def _add(self, source: _Source, row: AttemptRow, ep: StagedEpisode, videos: Mapping[str, VideoFileWriter],
             data: DataFileWriter, with_subtasks: bool, stats_cache: dict[tuple[str, bytes], Any]) -> None:
        """One good episode: its video remuxed, rows appended, statistics, metadata row and sidecar record."""
        frames = row.frames or 0
        index = (self.old.total_episodes if self.old else 0) + len(self.exported)
        record = row.record or {}
        instruction = record.get("instruction") or source.fingerprint.task
        task_index = self.tasks.setdefault(instruction, len(self.tasks))
        spans = {name: writer.add(ep.video[name], frames) for name, writer in videos.items()}
        cols = episode_frames(ep, index, self.frame, task_index, self.fps, record, self.outcomes)
        stats = episode_stats(ep, cols, self.cameras, self.fp.depth_video, stats_cache)
        data_span = data.add(cols)
        self.meta_rows.append(EpisodeMetaRow(
            episode_index=index, task=instruction, length=frames, dataset_from_index=self.frame,
            dataset_to_index=self.frame + frames, data_file=data_span,
            videos={camera_key(c.name): spans[c.name] for c in self.cameras}, stats=stats,
            subtasks=subtask_columns(record.get("segments", []), self.fps) if with_subtasks else {}))
        self.sidecar.append({**record, "schema_version": SCHEMA_VERSION, "dataset_episode_index": index,
                             **source.origin(), "staging_episode_id": row.episode_id,
                             "staging_episode_index": row.episode_index, "length": frames,
                             "content_hash": row.content_hash})
        self.exported.append((source, row))
        self.new_indices.append(index)
        self.frame += frames

    def _metadata(self, number: int, meta_next: tuple[int, int], data_next: tuple[int, int],
                  video_cursors: Mapping[str, tuple[int, int]]) -> VersionMetadata:
        """The version's small files: the published ones with this export's episodes added."""
        old = self.old
        total_episodes = (old.total_episodes if old else 0) + len(self.exported)
        marker = ExportMarker(version=number, repo_id=self.repo_id, schema=schema_identity(self.fp),
                              total_episodes=total_episodes, total_frames=self.frame, tasks=self.tasks,
                              next_data=data_next, next_meta=meta_next, next_videos=dict(video_cursors),
                              episodes=(*(old.episodes if old else ()),
                                        *(PublishedEpisode(r.episode_id, i, src.store_id)
                                          for (src, r), i in zip(self.exported, self.new_indices))),
                              removed=old.removed if old else ())
        return VersionMetadata(
            tasks=self.tasks, episode_stats=[m.stats for m in self.meta_rows],
            info=info_json(self.features, self.fps, total_episodes, self.frame, len(self.tasks),
                           self.fp.robot_type),
            marker=marker, sidecar=self.sidecar, stats_of_published=old is not None)


def _published_features(target: Published) -> Mapping[str, Any]:
    """The features of the dataset's published version (none when it has none or its info is unreadable)."""
    try:
        return dict(json.loads((target.current / INFO).read_text())["features"]) if target.current else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _has_subtask_columns(build: Path) -> bool:
    """Whether the version being appended to has LeRobot's sub-task columns (its first episodes file says)."""
    import pyarrow.parquet as pq

    files = sorted(build.glob("meta/episodes/chunk-*/file-*.parquet"))
    return not files or "dense_subtask_names" in pq.read_schema(files[0]).names
