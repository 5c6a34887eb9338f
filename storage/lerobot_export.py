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
import time
from collections.abc import Callable, Mapping, Sequence
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
    PublishedEpisode,
    annotation_key,
    camera_key,
    dataset_features,
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
            episodes: list[tuple[_Source, AttemptRow, StagedEpisode]] = []
            quarantined: list[str] = []
            for source in sources:
                present = set(marker.dataset_indices(source.store_id)) if marker else set()
                rows = [r for r in source.catalog.committed() if r.episode_id not in present]
                good, bad = _load_episodes(source, rows)
                episodes += good
                quarantined += bad
            if not episodes:
                return ExportReport(out, target.current.name if target.current else None, 0,
                                    marker.total_episodes if marker else 0, marker.total_frames if marker else 0,
                                    quarantined, reconciled, time.monotonic() - started)
            writer = _VersionWriter(target, marker, sources[0].fingerprint,
                                    repo_id or f"demoforge/{sources[0].fingerprint.task}", pause)
            version, published = writer.write(episodes, progress)
            pause("before_catalog")
            for source in sources:
                source.catalog.mark_exported({row.episode_id: idx for (src, row, _), idx
                                              in zip(episodes, writer.new_indices)
                                              if src is source and row.state == AttemptState.COMMITTED})
            prune_versions(target.versions, keep=KEEP_VERSIONS)
            return ExportReport(out, version, len(episodes), published.total_episodes, published.total_frames,
                                quarantined, reconciled, time.monotonic() - started)
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


def _load_episodes(source: _Source, rows: Sequence[AttemptRow]
                   ) -> tuple[list[tuple[_Source, AttemptRow, StagedEpisode]], list[str]]:
    """Read and check each committed episode; a corrupt one is quarantined and never exported."""
    good: list[tuple[_Source, AttemptRow, StagedEpisode]] = []
    quarantined: list[str] = []
    for row in rows:
        try:
            good.append((source, row, check_episode(source.staging, row, decode=False)))
        except StagingCorruptError as exc:
            source.catalog.quarantine(row.episode_id, f"export: {exc}")
            quarantined.append(row.episode_id)
    return good, quarantined


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

    def write(self, episodes: list[tuple[_Source, AttemptRow, StagedEpisode]],
              progress: Callable[[int, int], None] | None) -> tuple[str, ExportMarker]:
        old = self.old
        number = (old.version if old else 0) + 1
        build = start_version(self.target, number)
        self.pause("after_links")
        first_index = old.total_episodes if old else 0
        first_frame = old.total_frames if old else 0
        tasks: dict[str, int] = dict(old.tasks) if old else {}
        written: list[Path] = []

        # 1. videos: remux each camera's staged streams into this export's file(s).
        video_spans: dict[str, list[tuple[int, int, float, float]]] = {}
        video_cursors: dict[str, tuple[int, int]] = {}
        for camera in self.cameras:
            start = old.next_videos.get(camera.name, (0, 0)) if old else (0, 0)
            spans, nxt, files = _write_videos(build, camera_key(camera.name), start, self.fps,
                                              [ep.video[camera.name] for _src, _row, ep in episodes],
                                              [r.frames or 0 for _src, r, _ep in episodes])
            video_spans[camera.name], video_cursors[camera.name] = spans, nxt
            written += files
        self.pause("after_videos")

        # 2. frame data and per-episode metadata.
        data_rows: list[dict[str, Any]] = []
        meta_rows: list[dict[str, Any]] = []
        sidecar: list[dict[str, Any]] = []
        frame = first_frame
        for offset, (source, row, ep) in enumerate(episodes):
            frames = row.frames or 0
            index = first_index + offset
            self.new_indices.append(index)
            record = row.record or {}
            instruction = record.get("instruction") or source.fingerprint.task
            task_index = tasks.setdefault(instruction, len(tasks))
            data_rows.append(_episode_frames(ep, index, frame, task_index, self.fps, record))
            meta_rows.append({"episode_index": index, "tasks": [instruction], "length": frames,
                              "dataset_from_index": frame, "dataset_to_index": frame + frames,
                              **{f"videos/{camera_key(c.name)}/{k}": v for c in self.cameras
                                 for k, v in zip(("chunk_index", "file_index", "from_timestamp", "to_timestamp"),
                                                 video_spans[c.name][offset])},
                              "_stats": _episode_stats(ep, data_rows[-1], self.features, self.cameras,
                                                       self.fp.depth_video)})
            sidecar.append({**record, "schema_version": SCHEMA_VERSION, "dataset_episode_index": index,
                            **source.origin(), "staging_episode_id": row.episode_id,
                            "staging_episode_index": row.episode_index, "length": frames,
                            "content_hash": row.content_hash})
            frame += frames
            if progress is not None:
                progress(offset + 1, len(episodes))
        data_spans, data_next, files = _write_data(build, data_rows, self.features, old.next_data if old else (0, 0))
        written += files
        meta_next, files = _write_episode_meta(build, meta_rows, data_spans, old.next_meta if old else (0, 0))
        written += files
        self.pause("after_data")

        # 3. small metadata, rewritten whole: tasks, stats, info, sidecar, marker (last).
        written += _write_tasks(build, tasks)
        stats = _aggregate_stats(build, [m["_stats"] for m in meta_rows], old is not None)
        written.append(stats)
        total_episodes, total_frames = first_index + len(episodes), frame
        written.append(_write_info(build, self.features, self.fps, total_episodes, total_frames, len(tasks)))
        written.append(append_jsonl(build / SIDECAR, sidecar))
        marker = ExportMarker(version=number, repo_id=self.repo_id, schema=schema_identity(self.fp),
                              total_episodes=total_episodes, total_frames=total_frames, tasks=tasks,
                              next_data=data_next, next_meta=meta_next, next_videos=video_cursors,
                              episodes=(*(old.episodes if old else ()),
                                        *(PublishedEpisode(r.episode_id, i, src.store_id)
                                          for (src, r, _), i in zip(episodes, self.new_indices))))
        written.append(write_json(build / MARKER, marker.to_json()))
        return publish_version(self.target, build, written, self.pause), marker


def _write_videos(build: Path, key: str, start: Sequence[int], fps: int, streams: Sequence[bytes],
                  lengths: Sequence[int]) -> tuple[list[tuple[int, int, float, float]], tuple[int, int], list[Path]]:
    """Remux episode streams into per-camera mp4 files (rolling over near VIDEO_FILE_MB)."""
    from lerobot.datasets.utils import DEFAULT_VIDEO_PATH

    chunk, file = int(start[0]), int(start[1])
    spans: list[tuple[int, int, float, float]] = []
    files: list[Path] = []
    out = None
    out_stream = None
    frames_in_file = 0
    bytes_in_file = 0
    path: Path | None = None
    for data, length in zip(streams, lengths):
        if out is not None and bytes_in_file + len(data) > VIDEO_FILE_MB * 2**20:
            out.close()
            out = None
            chunk, file = _next_file(chunk, file)
        src = av.open(io.BytesIO(data), mode="r")
        try:
            in_stream = src.streams.video[0]
            if out is None:
                path = build / DEFAULT_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
                path.parent.mkdir(parents=True, exist_ok=True)
                out = av.open(str(path), mode="w", format="mp4")
                out_stream = out.add_stream_from_template(in_stream, opaque=True)  # copy, never encode
                files.append(path)
                frames_in_file = bytes_in_file = 0
            offset_s = frames_in_file / fps
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
                packet.stream = out_stream
                out.mux(packet)
        finally:
            src.close()
        if count != length:
            raise ExportError(f"{key}: staged stream holds {count} frames, the catalog says {length}")
        spans.append((chunk, file, offset_s, (frames_in_file + length) / fps))
        frames_in_file += length
        bytes_in_file += len(data)
    if out is not None:
        out.close()
    return spans, _next_file(chunk, file), files


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


def _write_data(build: Path, rows: Sequence[dict[str, Any]], features: Mapping[str, dict],
                start: Sequence[int]) -> tuple[list[tuple[int, int]], tuple[int, int], list[Path]]:
    """One parquet file per ~DATA_FILE_MB of new frames; returns each episode's (chunk, file)."""
    import pyarrow.parquet as pq
    from lerobot.datasets.utils import DEFAULT_DATA_PATH

    chunk, file = int(start[0]), int(start[1])
    spans: list[tuple[int, int]] = []
    files: list[Path] = []
    group: list[dict[str, Any]] = []
    group_bytes = 0

    def flush() -> None:
        nonlocal chunk, file, group, group_bytes
        if not group:
            return
        path = build / DEFAULT_DATA_PATH.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        table = _hf_table(group, features)
        with pq.ParquetWriter(path, schema=table.schema, compression="snappy", use_dictionary=True) as writer:
            start_row = 0
            for r in group:  # one row group per episode, as LeRobot writes them
                n = len(r["index"])
                writer.write_table(table.slice(start_row, n))
                start_row += n
        files.append(path)
        chunk, file = _next_file(chunk, file)
        group, group_bytes = [], 0

    for r in rows:
        size = sum(np.asarray(v).nbytes for k, v in r.items() if isinstance(v, np.ndarray))
        if group and group_bytes + size > DATA_FILE_MB * 2**20:
            flush()
        spans.append((chunk, file))
        group.append(r)
        group_bytes += size
    flush()
    return spans, (chunk, file), files


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
