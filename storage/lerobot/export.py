"""Export committed episodes of a staging store into a LeRobot v3.0 dataset, atomically and incrementally.

The exporter: which episodes go into a new version, in which order its files are written, and the sidecar and
marker that make it exactly-once. The files themselves (data parquet, per-camera mp4, episode metadata, stats,
tasks, info) are written by ``storage/lerobot/files.py``; the format is ``storage/lerobot/format.py``; how a
version is built beside the published one and swapped in is ``storage/lerobot/publish.py``.

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
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from demoforge.storage.catalog import AttemptRow, Catalog
from demoforge.storage.lerobot.files import (
    DataFileWriter,
    EpisodeMetaRow,
    VideoFileWriter,
    episode_frames,
    episode_stats,
    write_episode_meta,
    write_info,
    write_stats_file,
    write_tasks,
)
from demoforge.storage.lerobot.format import (
    INFO,
    MARKER,
    SIDECAR,
    ExportMarker,
    FileChecksum,
    PublishedEpisode,
    camera_key,
    dataset_features,
    file_checksum,
    schema_differences,
    schema_identity,
)
from demoforge.storage.lerobot.output_guard import output_overlap
from demoforge.storage.lerobot.publish import (
    KEEP_VERSIONS,
    ExportError,
    NotOurDatasetError,
    Published,
    append_jsonl,
    check_writable,
    lock_exports,
    prune_versions,
    publish_version,
    remove_unfinished,
    resolve_target,
    start_version,
    write_json,
)
from demoforge.storage.lerobot.subtasks import subtask_columns, write_temporal_proportions
from demoforge.storage.schema import SCHEMA_VERSION
from demoforge.storage.schema import AttemptState, Fingerprint, check_include, included
from demoforge.storage.staging import StagedEpisode, StagingCorruptError, StagingStore
from demoforge.storage.store import Store, open_store
from demoforge.storage.store_verify import check_episode
from demoforge.storage.write_errors import writing

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
    def catalog(self) -> Catalog:
        return self.store.catalog

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
                  progress: Callable[[int, int], None] | None = None,
                  stage_pause: Callable[[str], None] | None = None,
                  on_published: Callable[[ExportReport], None] | None = None,
                  include: str = "episodes") -> ExportReport:
    """Export the committed, not yet exported episodes of every store in ``stores`` (in that order) into the
    dataset at ``out``, as one new version. Exactly once per (store id, staging episode).

    ``include`` (storage/schema.py INCLUDE_CHOICES): the job's episodes (the default), the failures
    ``generate --keep-failures`` kept, or all; a kept failure's sidecar record says so (``kept_failure``).

    Every store's features (cameras and sizes, fps, state and action shapes, codec settings) must equal the
    others' and the dataset's; otherwise nothing is written and SchemaMismatchError names the difference.
    Safe while generate jobs write the stores: each is opened with ``open_store(path, "r+")`` (states only:
    ``exported``, and ``quarantined`` for an episode that fails its checks). ``stage_pause(name)`` is called
    between steps (a watching parent counts them as progress; tests kill the process there);
    ``on_published(report)`` right after the new version is published, before the catalog records it.
    """
    started = time.monotonic()
    pause = stage_pause or (lambda _name: None)
    out = Path(out)
    if not stores:
        raise ExportError("no store to export from")
    try:
        check_include(include)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    with contextlib.ExitStack() as opened:
        sources = [_open_source(Path(p), opened) for p in stores]
        _refuse_duplicate_stores(sources)
        target = resolve_target(out)  # first: it refuses a path no dataset can have (a NUL byte, too long)
        inside = output_overlap(out, {f"the store {n + 1}" if len(sources) > 1 else "the store": s.path
                                      for n, s in enumerate(sources)})
        if inside is not None:
            raise ExportError(f"--out {inside}: a dataset is written apart from the stores it is exported from; "
                              "nothing was written")
        _check_schemas(sources, target.marker, out)
        check_writable(out.parent)
        lock_fd = lock_exports(target.versions)
        try:
            remove_unfinished(target.versions, target.current)
            marker = _attribute(target.marker, sources)
            reconciled = sum(_reconcile(source, marker) for source in sources)
            # What the dataset already holds is the published marker's word, not the catalog's: a store
            # can feed a second dataset, and a crash can fall between publishing and the catalog update.
            pending: list[tuple[_Source, AttemptRow]] = []
            gone: list[str] = []
            edited_out: list[str] = []
            left_out = 0
            for source in sources:
                present = set(marker.dataset_indices(source.store_id)) if marker else set()
                rows = [r for r in source.catalog.committed() if r.episode_id not in present]
                taken = [r for r in rows if included(include, r.kept_failure)]
                left_out += len(rows) - len(taken)
                rows = taken
                removed = marker.removed_ids(source.store_id, legacy=len(sources) == 1) if marker else set()
                edited_out += [r.episode_id for r in rows if r.episode_id in removed]
                rows = [r for r in rows if r.episode_id not in removed]
                pruned = source.catalog.pruned_ids()  # exported earlier, staged data deleted: never read again
                gone += [r.episode_id for r in rows if r.episode_id in pruned]
                pending += [(source, r) for r in rows if r.episode_id not in pruned]
            check_free_space(out, [row for _source, row in pending])  # before anything is written
            writer = _VersionWriter(target, marker, sources[0].fingerprint,
                                    repo_id or f"demoforge/{sources[0].fingerprint.task}", pause)
            result = writer.write(_read_ahead(pending), len(pending), progress)
            if result is None:  # every pending episode failed its checks (or none was pending)
                return ExportReport(out, target.current.name if target.current else None, 0,
                                    marker.total_episodes if marker else 0, marker.total_frames if marker else 0,
                                    writer.quarantined, reconciled, time.monotonic() - started, tuple(gone),
                                    tuple(edited_out), left_out)
            version, published = result
            report = ExportReport(out, version, len(writer.exported), published.total_episodes,
                                  published.total_frames, writer.quarantined, reconciled,
                                  time.monotonic() - started, tuple(gone), tuple(edited_out), left_out)
            if on_published is not None:
                on_published(report)
            pause("before_catalog")
            for source in sources:
                source.catalog.mark_exported({row.episode_id: idx for (src, row), idx
                                              in zip(writer.exported, writer.new_indices)
                                              if src is source and row.state == AttemptState.COMMITTED})
            pause("after_catalog")
            prune_versions(target.versions, keep=KEEP_VERSIONS)
            return dataclasses.replace(report, elapsed_s=time.monotonic() - started)
        finally:
            os.close(lock_fd)


def _open_source(path: Path, opened: contextlib.ExitStack) -> _Source:
    store = opened.enter_context(open_store(path, "r+"))
    fingerprint = store.fingerprint  # refuses unsafe camera / feature names before any write
    if fingerprint is None or store.staging is None:
        raise ExportError(f"{path} holds no job yet; nothing to export")
    return _Source(path, store.catalog.ensure_store_id(), fingerprint, store)


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
        for row in source.catalog.attempts((AttemptState.EXPORTED,)):
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
    pending = {r.episode_id: published[r.episode_id] for r in source.catalog.attempts((AttemptState.COMMITTED,))
               if r.episode_id in published}
    if pending:
        source.catalog.mark_exported(pending)
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
                source.catalog.quarantine(row.episode_id, f"export: {got}")  # the catalog: this thread only
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
    """Builds one new dataset version next to the published one."""

    def __init__(self, target: Published, marker: ExportMarker | None, fingerprint: Fingerprint, repo_id: str,
                 pause: Callable[[str], None]) -> None:
        self.target = target
        self.old = marker  # the published marker, its entries attributed to stores
        self.fp = fingerprint
        self.repo_id = repo_id
        self.pause = pause
        self.fps = int(fingerprint.fps)
        self.robot_type = fingerprint.robot_type
        self.cameras = fingerprint.cameras
        # Outcome flags (next.success, next.done), unless appending to a version exported before them
        self.outcomes = marker is None or "next.done" in _published_features(target)
        self.features = dataset_features(fingerprint, outcomes=self.outcomes)
        self.new_indices: list[int] = []
        self.exported: list[tuple[_Source, AttemptRow]] = []
        self.quarantined: list[str] = []

    def write(self, episodes: Iterable[tuple[_Source, AttemptRow, StagedEpisode | None]], total: int,
              progress: Callable[[int, int], None] | None) -> tuple[str, ExportMarker] | None:
        """Build and publish the next version from ``episodes``, consumed one at a time: each is remuxed,
        its frames appended to the open parquet file, its stats computed, then dropped. Returns None when no
        episode was good (nothing published). On any error the unfinished version folder is removed at once."""
        old = self.old
        number = (old.version if old else 0) + 1
        build = start_version(self.target, number)
        try:
            with writing(f"the new dataset version {build.name.removesuffix('.partial')}", build):
                return self._write(build, number, episodes, total, progress)
        except BaseException:
            for leftover in (build, build.with_name(build.name.removesuffix(".partial"))):
                if leftover.exists() and leftover != self.target.current:
                    shutil.rmtree(leftover, ignore_errors=True)  # give the space back now, not at the next export
            raise

    def _write(self, build: Path, number: int, episodes: Iterable[tuple[_Source, AttemptRow, StagedEpisode | None]],
               total: int, progress: Callable[[int, int], None] | None) -> tuple[str, ExportMarker] | None:
        old = self.old
        self.pause("after_links")
        first_index = old.total_episodes if old else 0
        first_frame = old.total_frames if old else 0
        tasks: dict[str, int] = dict(old.tasks) if old else {}
        written: list[Path] = []
        videos = {c.name: VideoFileWriter(build, camera_key(c.name), old.next_videos.get(c.name, (0, 0))
                                           if old else (0, 0), self.fps) for c in self.cameras}
        data = DataFileWriter(build, self.features, old.next_data if old else (0, 0))
        meta_rows: list[EpisodeMetaRow] = []  # small per-episode records (stats, indices): kept to the end
        # Sub-task columns (subtasks.py), unless appending to a version exported before them: one schema per dataset
        with_subtasks = old is None or _has_subtask_columns(build)
        stats_cache: dict[tuple[str, bytes], Any] = {}
        sidecar: list[dict[str, Any]] = []
        frame = first_frame
        try:
            done = 0
            for item in episodes:  # (no enumerate: its cached result tuple would keep the last episode alive)
                source, row, ep = item
                del item
                done += 1
                if ep is None:
                    self.quarantined.append(row.episode_id)
                else:
                    frames = row.frames or 0
                    index = first_index + len(self.exported)
                    record = row.record or {}
                    instruction = record.get("instruction") or source.fingerprint.task
                    task_index = tasks.setdefault(instruction, len(tasks))
                    spans = {name: writer.add(ep.video[name], frames) for name, writer in videos.items()}
                    cols = episode_frames(ep, index, frame, task_index, self.fps, record, self.outcomes)
                    stats = episode_stats(ep, cols, self.cameras, self.fp.depth_video, stats_cache)
                    data_span = data.add(cols)
                    meta_rows.append(EpisodeMetaRow(
                        episode_index=index, task=instruction, length=frames, dataset_from_index=frame,
                        dataset_to_index=frame + frames, data_file=data_span,
                        videos={camera_key(c.name): spans[c.name] for c in self.cameras}, stats=stats,
                        subtasks=subtask_columns(record.get("segments", []), self.fps) if with_subtasks else {}))
                    sidecar.append({**record, "schema_version": SCHEMA_VERSION, "dataset_episode_index": index,
                                    **source.origin(), "staging_episode_id": row.episode_id,
                                    "staging_episode_index": row.episode_index, "length": frames,
                                    "content_hash": row.content_hash})
                    self.exported.append((source, row))
                    self.new_indices.append(index)
                    frame += frames
                    del ep, cols
                if progress is not None:
                    progress(done, total)
        finally:
            video_cursors = {name: writer.close() for name, writer in videos.items()}
            data_next = data.close()
        if not self.exported:
            shutil.rmtree(build)
            return None
        for writer in videos.values():
            written += writer.files
        written += data.files
        self.pause("after_videos")
        meta_next, files = write_episode_meta(build, meta_rows, old.next_meta if old else (0, 0))
        written += files
        self.pause("after_data")

        # small metadata, rewritten whole: proportions, tasks, stats, info, sidecar, marker (last).
        written += write_temporal_proportions(build)
        written += write_tasks(build, tasks)
        written.append(write_stats_file(build, [m.stats for m in meta_rows], old is not None))
        total_episodes, total_frames = first_index + len(self.exported), frame
        written.append(write_info(build, self.features, self.fps, total_episodes, total_frames, len(tasks),
                                  self.robot_type))
        written.append(append_jsonl(build / SIDECAR, sidecar))
        marker = ExportMarker(version=number, repo_id=self.repo_id, schema=schema_identity(self.fp),
                              total_episodes=total_episodes, total_frames=total_frames, tasks=tasks,
                              next_data=data_next, next_meta=meta_next, next_videos=video_cursors,
                              episodes=(*(old.episodes if old else ()),
                                        *(PublishedEpisode(r.episode_id, i, src.store_id)
                                          for (src, r), i in zip(self.exported, self.new_indices))),
                              files=_file_checksums(build, old, written), removed=old.removed if old else ())
        written.append(write_json(build / MARKER, marker.to_json()))
        return publish_version(self.target, build, written, self.pause), marker


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


def _file_checksums(build: Path, old: ExportMarker | None, written: Sequence[Path]) -> dict[str, FileChecksum]:
    """The checksum of every file of the new version (the marker aside): files written or rewritten by this
    export are hashed; hard links to the published version keep the checksum recorded when they were written
    (a version without records, from before checksums, is hashed in full once)."""
    fresh = {p.resolve() for p in written}
    out: dict[str, FileChecksum] = {}
    for dirpath, _dirs, names in os.walk(build):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(build).as_posix()
            if rel == MARKER:
                continue
            known = old.files.get(rel) if old is not None and path.resolve() not in fresh else None
            out[rel] = known if known is not None else file_checksum(path)
    return out
