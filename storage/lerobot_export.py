"""Export committed episodes of a staging store into a LeRobot v3.0 dataset, atomically and incrementally.

The exporter: what goes into a new version and how its files are written (data parquet, per-camera mp4,
episode metadata, stats, tasks, info, sidecar, marker). The format it writes is ``storage/lerobot_format.py``;
how a version is built beside the published one and swapped in is ``storage/publish.py``.

Exactly once: the published ``meta/demoforge.json`` lists every exported staging episode with its dataset
index; it is the truth, and the catalog's ``exported`` state is reconciled from it.

No re-encoding: each camera's staged fragmented-MP4 stream is remuxed (packet copy, timestamps shifted)
into the shared per-camera mp4 of this export.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

from demoforge.pipeline.contract import ANNOTATION_KEYS, SCHEMA_VERSION
from demoforge.storage.catalog import AttemptRow, Catalog
from demoforge.storage.lerobot_format import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_MB,
    MARKER,
    SIDECAR,
    STATS_IMAGE_PX,
    VIDEO_FILE_MB,
    ExportMarker,
    FileChecksum,
    PublishedEpisode,
    annotation_key,
    camera_key,
    dataset_features,
    file_checksum,
    schema_differences,
    schema_identity,
)
from demoforge.storage.publish import (
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
    unlink_shared,
    write_json,
)
from demoforge.storage.reader import open_store_updater
from demoforge.storage.depth import decode_codes, dequantize
from demoforge.storage.schema import AttemptState, CameraSpec, DepthVideoIdentity, Fingerprint
from demoforge.storage.staging import StagedEpisode, StagingCorruptError, StagingStore
from demoforge.storage.verify import check_episode
from demoforge.storage.video import decode_indices
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


@dataclass(frozen=True)
class _Source:
    """One store an export reads: where it is, who it is, its job, and its opened catalog and staging."""

    path: Path
    store_id: str
    fingerprint: Fingerprint
    catalog: Catalog
    staging: StagingStore

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
                  stage_pause: Callable[[str], None] | None = None) -> ExportReport:
    """Export the committed, not yet exported episodes of every store in ``stores`` (in that order) into the
    dataset at ``out``, as one new version. Exactly once per (store id, staging episode).

    Every store's features (cameras and sizes, fps, state and action shapes, codec settings) must equal the
    others' and the dataset's; otherwise nothing is written and SchemaMismatchError names the difference.
    Safe while generate jobs write the stores: each is opened with ``open_store_updater`` (states only:
    ``exported``, and ``quarantined`` for an episode that fails its checks). ``stage_pause(name)`` is a
    fault-injection hook called between steps (tests kill the process there).
    """
    started = time.monotonic()
    pause = stage_pause or (lambda _name: None)
    out = Path(out)
    if not stores:
        raise ExportError("no store to export from")
    with contextlib.ExitStack() as opened:
        sources = [_open_source(Path(p), opened) for p in stores]
        _refuse_duplicate_stores(sources)
        target = resolve_target(out)
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
            for source in sources:
                present = set(marker.dataset_indices(source.store_id)) if marker else set()
                rows = [r for r in source.catalog.committed() if r.episode_id not in present]
                pruned = source.catalog.pruned_ids()  # exported earlier, staged data deleted: never read again
                gone += [r.episode_id for r in rows if r.episode_id in pruned]
                pending += [(source, r) for r in rows if r.episode_id not in pruned]
            check_free_space(out, [row for _source, row in pending])  # before anything is written
            writer = _VersionWriter(target, marker, sources[0].fingerprint,
                                    repo_id or f"demoforge/{sources[0].fingerprint.task}", pause)
            result = writer.write(_read_one_at_a_time(pending), len(pending), progress)
            if result is None:  # every pending episode failed its checks (or none was pending)
                return ExportReport(out, target.current.name if target.current else None, 0,
                                    marker.total_episodes if marker else 0, marker.total_frames if marker else 0,
                                    writer.quarantined, reconciled, time.monotonic() - started, tuple(gone))
            version, published = result
            pause("before_catalog")
            for source in sources:
                source.catalog.mark_exported({row.episode_id: idx for (src, row), idx
                                              in zip(writer.exported, writer.new_indices)
                                              if src is source and row.state == AttemptState.COMMITTED})
            prune_versions(target.versions, keep=KEEP_VERSIONS)
            return ExportReport(out, version, len(writer.exported), published.total_episodes,
                                published.total_frames, writer.quarantined, reconciled,
                                time.monotonic() - started, tuple(gone))
        finally:
            os.close(lock_fd)


def _open_source(path: Path, opened: contextlib.ExitStack) -> _Source:
    store = opened.enter_context(open_store_updater(path))
    fingerprint = store.fingerprint  # refuses unsafe camera / feature names before any write
    if fingerprint is None or store.staging is None:
        raise ExportError(f"{path} holds no job yet; nothing to export")
    return _Source(path, store.catalog.ensure_store_id(), fingerprint, store.catalog, store.staging)


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


def _read_one_at_a_time(pending: Sequence[tuple[_Source, AttemptRow]]
                        ) -> Iterator[tuple[_Source, AttemptRow, StagedEpisode | None]]:
    """Each pending episode read and checked when the writer asks for it, so an export holds one episode's
    data at a time whatever the number pending. A corrupt one is quarantined (yielded as None: never
    exported)."""
    for source, row in pending:
        try:
            yield source, row, check_episode(source.staging, row, decode=False)
        except StagingCorruptError as exc:
            source.catalog.quarantine(row.episode_id, f"export: {exc}")
            yield source, row, None


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
def _next_file(chunk: int, file: int) -> tuple[int, int]:
    from lerobot.datasets.utils import update_chunk_file_indices

    return update_chunk_file_indices(chunk, file, CHUNKS_SIZE)


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
        self.cameras = fingerprint.cameras
        self.features = dataset_features(fingerprint)
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
        videos = {c.name: _VideoFileWriter(build, camera_key(c.name), old.next_videos.get(c.name, (0, 0))
                                           if old else (0, 0), self.fps) for c in self.cameras}
        data = _DataFileWriter(build, self.features, old.next_data if old else (0, 0))
        meta_rows: list[dict[str, Any]] = []  # small per-episode records (stats, indices): kept to the end
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
                    cols = _episode_frames(ep, index, frame, task_index, self.fps, record)
                    stats = _episode_stats(ep, cols, self.features, self.cameras, self.fp.depth_video)
                    data_span = data.add(cols)
                    meta_rows.append({"episode_index": index, "tasks": [instruction], "length": frames,
                                      "dataset_from_index": frame, "dataset_to_index": frame + frames,
                                      **{f"videos/{camera_key(c.name)}/{k}": v for c in self.cameras
                                         for k, v in zip(("chunk_index", "file_index", "from_timestamp",
                                                          "to_timestamp"), spans[c.name])},
                                      "_stats": stats, "_data": data_span})
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
        meta_next, files = _write_episode_meta(build, meta_rows, [m.pop("_data") for m in meta_rows],
                                               old.next_meta if old else (0, 0))
        written += files
        self.pause("after_data")

        # small metadata, rewritten whole: tasks, stats, info, sidecar, marker (last).
        written += _write_tasks(build, tasks)
        stats = _aggregate_stats(build, [m["_stats"] for m in meta_rows], old is not None)
        written.append(stats)
        total_episodes, total_frames = first_index + len(self.exported), frame
        written.append(_write_info(build, self.features, self.fps, total_episodes, total_frames, len(tasks)))
        written.append(append_jsonl(build / SIDECAR, sidecar))
        marker = ExportMarker(version=number, repo_id=self.repo_id, schema=schema_identity(self.fp),
                              total_episodes=total_episodes, total_frames=total_frames, tasks=tasks,
                              next_data=data_next, next_meta=meta_next, next_videos=video_cursors,
                              episodes=(*(old.episodes if old else ()),
                                        *(PublishedEpisode(r.episode_id, i, src.store_id)
                                          for (src, r), i in zip(self.exported, self.new_indices))),
                              files=_file_checksums(build, old, written))
        written.append(write_json(build / MARKER, marker.to_json()))
        return publish_version(self.target, build, written, self.pause), marker


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


class _VideoFileWriter:
    """Remuxes episode streams, one at a time, into one camera's mp4 files (rolling over near VIDEO_FILE_MB)."""

    def __init__(self, build: Path, key: str, start: Sequence[int], fps: int) -> None:
        self.build, self.key, self.fps = build, key, fps
        self.chunk, self.file = int(start[0]), int(start[1])
        self.files: list[Path] = []
        self._out: Any = None
        self._out_stream: Any = None
        self._frames_in_file = 0
        self._bytes_in_file = 0

    def add(self, data: bytes, length: int) -> tuple[int, int, float, float]:
        """Append one episode's staged stream; returns its (chunk, file, from_timestamp, to_timestamp)."""
        from lerobot.datasets.utils import DEFAULT_VIDEO_PATH

        if self._out is not None and self._bytes_in_file + len(data) > VIDEO_FILE_MB * 2**20:
            self._out.close()
            self._out = None
            self.chunk, self.file = _next_file(self.chunk, self.file)
        src = av.open(io.BytesIO(data), mode="r")
        try:
            in_stream = src.streams.video[0]
            if self._out is None:
                path = self.build / DEFAULT_VIDEO_PATH.format(video_key=self.key, chunk_index=self.chunk,
                                                              file_index=self.file)
                path.parent.mkdir(parents=True, exist_ok=True)
                self._out = av.open(str(path), mode="w", format="mp4")
                self._out_stream = self._out.add_stream_from_template(in_stream, opaque=True)  # copy, never encode
                self.files.append(path)
                self._frames_in_file = self._bytes_in_file = 0
            offset_s = self._frames_in_file / self.fps
            # Encoders with frame reordering start presentation one frame late (an edit list hides it in a
            # standalone file); shift so this episode's first frame is shown exactly at ``offset_s``.
            first_pts = min(p.pts for p in src.demux(in_stream) if p.pts is not None)
            src.seek(0)
            shift = round(offset_s / in_stream.time_base) - first_pts
            count = 0
            for packet in src.demux(in_stream):
                if packet.dts is None and packet.pts is None:
                    continue
                if packet.pts is not None:
                    packet.pts += shift
                    count += 1
                if packet.dts is not None:
                    packet.dts += shift
                packet.stream = self._out_stream
                self._out.mux(packet)
        finally:
            src.close()
        if count != length:
            raise ExportError(f"{self.key}: staged stream holds {count} frames, the catalog says {length}")
        span = (self.chunk, self.file, offset_s, (self._frames_in_file + length) / self.fps)
        self._frames_in_file += length
        self._bytes_in_file += len(data)
        return span

    def close(self) -> tuple[int, int]:
        """Finish the open file; returns the cursor the next export starts at."""
        if self._out is not None:
            self._out.close()
            self._out = None
        return _next_file(self.chunk, self.file)


class _DataFileWriter:
    """Appends episodes' frames to parquet files (one row group per episode, as LeRobot writes them),
    converting them in bounded batches and rolling over to a new file near DATA_FILE_MB."""

    BATCH_EPISODES = 32
    BATCH_BYTES = 16 << 20

    def __init__(self, build: Path, features: Mapping[str, dict], start: Sequence[int]) -> None:
        self.build, self.features = build, features
        self.chunk, self.file = int(start[0]), int(start[1])
        self.files: list[Path] = []
        self._writer: Any = None
        self._pending: list[dict[str, Any]] = []
        self._pending_bytes = 0
        self._file_bytes = 0

    def add(self, cols: dict[str, Any]) -> tuple[int, int]:
        """Queue one episode's columns; returns the (chunk, file) its rows go to."""
        size = sum(np.asarray(v).nbytes for v in cols.values() if isinstance(v, np.ndarray))
        if self._file_bytes and self._file_bytes + size > DATA_FILE_MB * 2**20:
            self._flush()
            self._close_file()
            self.chunk, self.file = _next_file(self.chunk, self.file)
        self._pending.append(cols)
        self._pending_bytes += size
        self._file_bytes += size
        if len(self._pending) >= self.BATCH_EPISODES or self._pending_bytes >= self.BATCH_BYTES:
            self._flush()
        return self.chunk, self.file

    def _flush(self) -> None:
        import pyarrow.parquet as pq
        from lerobot.datasets.utils import DEFAULT_DATA_PATH

        if not self._pending:
            return
        table = _hf_table(self._pending, self.features)
        if self._writer is None:
            path = self.build / DEFAULT_DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(path, schema=table.schema, compression="snappy", use_dictionary=True)
            self.files.append(path)
        start_row = 0
        for cols in self._pending:
            n = len(cols["index"])
            self._writer.write_table(table.slice(start_row, n))
            start_row += n
        self._pending, self._pending_bytes = [], 0

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._file_bytes = 0

    def close(self) -> tuple[int, int]:
        self._flush()
        had_file = self._writer is not None
        self._close_file()
        return _next_file(self.chunk, self.file) if had_file else (self.chunk, self.file)


def _episode_frames(ep: StagedEpisode, index: int, first_frame: int, task_index: int, fps: int,
                    record: Mapping[str, Any]) -> dict[str, Any]:
    n = len(ep.action)
    cols: dict[str, Any] = {name: values.astype(np.float32) for name, values in ep.state.items()}
    cols["action"] = ep.action.astype(np.float32)
    cols["next.reward"] = ep.reward.astype(np.float32)
    for i, key in enumerate(ANNOTATION_KEYS):
        cols[annotation_key(key)] = ep.annotations[:, i].astype(np.int64)
    subtasks = [{"role": "assistant", "content": s.get("instruction") or s["name"], "style": "subtask",
                 "timestamp": float(np.float32(s["start_step"] / fps)), "camera": None, "tool_calls": None}
                for s in record.get("segments", [])]
    cols["language_persistent"] = [subtasks] * n
    cols["language_events"] = [[] for _ in range(n)]
    frame_index = np.arange(n, dtype=np.int64)
    cols["timestamp"] = (frame_index / fps).astype(np.float32)
    cols["frame_index"] = frame_index
    cols["episode_index"] = np.full(n, index, dtype=np.int64)
    cols["index"] = first_frame + frame_index
    cols["task_index"] = np.full(n, task_index, dtype=np.int64)
    return cols


def _hf_table(rows: Sequence[Mapping[str, Any]], features: Mapping[str, dict]):
    import datasets

    datasets.disable_progress_bars()  # one bar per export would fill a daemon's log
    from lerobot.datasets.feature_utils import get_hf_features_from_features

    hf_features = get_hf_features_from_features({k: {**v, "shape": tuple(v["shape"])} for k, v in features.items()})
    def column(value: Any, key: str) -> list[Any]:
        if not isinstance(value, np.ndarray):
            return list(value)
        return (value.reshape(len(value)) if tuple(features[key]["shape"]) == (1,) else value).tolist()

    merged = {key: [v for r in rows for v in column(r[key], key)] for key in hf_features}
    return datasets.Dataset.from_dict(merged, features=hf_features, split="train").with_format("arrow")[:]


def _stats_columns(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    return {f"stats/{feature}/{name}": np.asarray(value).tolist()
            for feature, per in stats.items() for name, value in per.items()}


def _write_episode_meta(build: Path, rows: Sequence[dict[str, Any]], data_spans: Sequence[tuple[int, int]],
                        start: Sequence[int]) -> tuple[tuple[int, int], list[Path]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lerobot.datasets.utils import DEFAULT_EPISODES_PATH

    chunk, file = int(start[0]), int(start[1])
    records = []
    for row, (dchunk, dfile) in zip(rows, data_spans):
        rec = {k: v for k, v in row.items() if k != "_stats"}
        rec = {"episode_index": rec.pop("episode_index"), "tasks": rec.pop("tasks"), "length": rec.pop("length"),
               "data/chunk_index": dchunk, "data/file_index": dfile,
               "dataset_from_index": rec.pop("dataset_from_index"), "dataset_to_index": rec.pop("dataset_to_index"),
               **rec, **_stats_columns(row["_stats"]),
               "meta/episodes/chunk_index": chunk, "meta/episodes/file_index": file}
        records.append(rec)
    table = pa.Table.from_pylist(records)
    path = build / DEFAULT_EPISODES_PATH.format(chunk_index=chunk, file_index=file)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")
    return _next_file(chunk, file), [path]


def _episode_stats(ep: StagedEpisode, frames: Mapping[str, Any], features: Mapping[str, dict],
                   cameras: Sequence[CameraSpec], depth: DepthVideoIdentity | None = None
                   ) -> dict[str, dict[str, np.ndarray]]:
    """Per-episode stats through lerobot's own helpers; camera stats from a sample of decoded frames (depth:
    in metres, dequantized by lerobot, not divided by 255, as lerobot's writer keeps depth stats)."""
    from lerobot.datasets.compute_stats import (
        auto_downsample_height_width,
        compute_episode_stats,
        get_feature_stats,
        sample_indices,
    )

    numeric = {k: np.asarray(v) for k, v in frames.items()
               if features[k]["dtype"] not in ("video", "language", "string")}
    numeric = {k: v.reshape(len(v)) if features[k]["shape"] == [1] else v for k, v in numeric.items()}
    stats = compute_episode_stats(numeric, {k: {**features[k], "shape": tuple(features[k]["shape"])}
                                            for k in numeric})
    for camera in cameras:
        wanted = sample_indices(len(ep.action))
        if camera.is_depth:
            assert depth is not None
            found = {i: dequantize(codes, depth)[..., None]
                     for i, codes in decode_codes(ep.video[camera.name], wanted).items()}
        else:
            found = decode_indices(ep.video[camera.name], wanted)
        decoded = [found[int(i)] for i in sorted(set(int(i) for i in wanted)) if int(i) in found]
        # Stride to ~64 px (LeRobot strides to ~150 px): pixel statistics barely move, and image stats were 95%
        # of export time at 224x224 (tools/bench_export.py).
        images = np.stack([auto_downsample_height_width(img.transpose(2, 0, 1), target_size=STATS_IMAGE_PX,
                                                        max_size_threshold=2 * STATS_IMAGE_PX) for img in decoded])
        per = get_feature_stats(images, axis=(0, 2, 3), keepdims=True)
        scale = 1.0 if camera.is_depth else 255.0
        stats[camera_key(camera.name)] = {k: v if k == "count" else np.squeeze(v / scale, axis=0)
                                          for k, v in per.items()}
    return stats


def _aggregate_stats(build: Path, new: Sequence[Mapping[str, Mapping[str, np.ndarray]]], has_old: bool) -> Path:
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.io_utils import load_stats, write_stats
    from lerobot.datasets.utils import STATS_PATH

    parts = list(new)
    if has_old:
        old = load_stats(build)
        if old:
            parts.insert(0, old)
    stats = aggregate_stats(parts)
    path = build / STATS_PATH
    unlink_shared(path)  # a hard link to the published version: replace, never write through
    write_stats(stats, build)
    return path


def _write_tasks(build: Path, tasks: Mapping[str, int]) -> list[Path]:
    import pandas as pd
    from lerobot.datasets.utils import DEFAULT_TASKS_PATH

    path = build / DEFAULT_TASKS_PATH
    unlink_shared(path)
    df = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks.keys()), name="task"))
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path)
    return [path]


def _write_info(build: Path, features: Mapping[str, dict], fps: int, episodes: int, frames: int, tasks: int
                ) -> Path:
    from lerobot.datasets.utils import DEFAULT_DATA_PATH, DEFAULT_VIDEO_PATH, INFO_PATH

    info = {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": features, "total_episodes": episodes,
            "total_frames": frames, "total_tasks": tasks, "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB,
            "data_path": DEFAULT_DATA_PATH, "video_path": DEFAULT_VIDEO_PATH,
            "robot_type": None, "splits": {"train": f"0:{episodes}"}}
    return write_json(build / INFO_PATH, info)
