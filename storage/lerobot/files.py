"""The files of one LeRobot v3.0 dataset version, written one episode at a time: the per-camera mp4 files
(remuxed packets, never re-encoded), the data parquet files, the episode metadata, stats, tasks and info.

What goes into a version, and in which order, is ``storage/lerobot/export.py``; the names and features of the
format are ``storage/lerobot/format.py``. Per-episode statistics are read from staging (computed while the
episode was recorded, ``storage/episode_stats.py``) and combined by LeRobot's aggregation
(``storage/lerobot/stats_file.py``). Nothing here imports lerobot, torch or ``datasets``: writing a version needs
pyarrow, pandas and PyAV only.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np

from demoforge.storage.depth import decode_codes, dequantize
from demoforge.storage.episode_stats import EpisodeStats
from demoforge.storage.lerobot.arrow_schema import data_schema
from demoforge.storage.lerobot.format import (
    AUTOMATIC_COLUMNS,
    OUTCOME_COLUMNS,
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_MB,
    DATA_PATH,
    EPISODES_PATH,
    STATS,
    TASKS,
    VIDEO_FILE_MB,
    VIDEO_PATH,
    annotation_key,
    camera_key,
    next_file,
)
from demoforge.storage.lerobot.publish import ExportError, replace_file, unlink_shared
from demoforge.storage.lerobot_stats import FeatureStats, depth_stats, rgb_stats, sample_indices, strided, vector_stats
from demoforge.storage.lerobot.stats_file import aggregate_stats, read_stats, stats_json_text
from demoforge.storage.lerobot.subtasks import arrow_types
from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.storage.schema import CameraSpec, DepthVideoIdentity
from demoforge.storage.staging import StagedEpisode
from demoforge.storage.video import decode_indices


def import_libraries() -> None:
    """Import what writing a version needs (about a second, once per process)."""
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401


class VideoFileWriter:
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
        if self._out is not None and self._bytes_in_file + len(data) > VIDEO_FILE_MB * 2**20:
            self._out.close()
            self._out = None
            self.chunk, self.file = next_file(self.chunk, self.file)
        src = av.open(io.BytesIO(data), mode="r")
        try:
            in_stream = src.streams.video[0]
            if in_stream.time_base is None:
                raise ExportError(f"{self.key}: a staged stream has no time base")
            if self._out is None:
                path = self.build / VIDEO_PATH.format(video_key=self.key, chunk_index=self.chunk,
                                                              file_index=self.file)
                path.parent.mkdir(parents=True, exist_ok=True)
                self._out = av.open(str(path), mode="w", format="mp4")
                self._out_stream = self._out.add_stream_from_template(in_stream, opaque=True)  # copy, never encode
                self.files.append(path)
                self._frames_in_file = self._bytes_in_file = 0
            offset_s = self._frames_in_file / self.fps
            packets = [p for p in src.demux(in_stream) if p.dts is not None or p.pts is not None]
            # Encoders with frame reordering start presentation one frame late (an edit list hides it in a
            # standalone file); shift so this episode's first frame is shown exactly at ``offset_s``.
            first_pts = min((p.pts for p in packets if p.pts is not None), default=0)
            shift = round(offset_s / in_stream.time_base) - first_pts
            # A fragmented stream read front to back gives its packets no duration, and mp4 drops the last
            # sample of a file whose last packet has none: every packet is one frame.
            frame_ticks = round(1 / (self.fps * in_stream.time_base))
            count = 0
            for packet in packets:
                if not packet.duration:
                    packet.duration = frame_ticks
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
        return next_file(self.chunk, self.file)


class DataFileWriter:
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
        self._tables: list[Any] = []  # add_table's episodes not written yet
        self._tables_bytes = 0
        self._file_bytes = 0
        self._schema: Any = None

    def add(self, cols: dict[str, Any]) -> tuple[int, int]:
        """Queue one episode's columns; returns the (chunk, file) its rows go to."""
        size = sum(np.asarray(v).nbytes for v in cols.values() if isinstance(v, np.ndarray))
        if self._file_bytes and self._file_bytes + size > DATA_FILE_MB * 2**20:
            self._flush()
            self._close_file()
            self.chunk, self.file = next_file(self.chunk, self.file)
        self._pending.append(cols)
        self._pending_bytes += size
        self._file_bytes += size
        if len(self._pending) >= self.BATCH_EPISODES or self._pending_bytes >= self.BATCH_BYTES:
            self._flush()
        return self.chunk, self.file

    def add_table(self, table: Any) -> tuple[int, int]:
        """Append one episode's rows as they are (an arrow table: an edit copying rows of a published file);
        returns the (chunk, file) they go to. Episodes are written in batches (row groups of up to
        BATCH_EPISODES episodes: a write per episode costs more than the copy)."""
        self._flush()
        if self._file_bytes and self._file_bytes + table.nbytes > DATA_FILE_MB * 2**20:
            self._flush_tables()
            self._close_file()
            self.chunk, self.file = next_file(self.chunk, self.file)
        if self._tables and table.schema != self._tables[0].schema:
            table = table.cast(self._tables[0].schema)
        self._tables.append(table)
        self._tables_bytes += table.nbytes
        self._file_bytes += table.nbytes
        if len(self._tables) >= self.BATCH_EPISODES or self._tables_bytes >= self.BATCH_BYTES:
            self._flush_tables()
        return self.chunk, self.file

    def _flush_tables(self) -> None:
        import pyarrow as pa

        if not self._tables:
            return
        writer = self._open(self._tables[0].schema)
        batch = pa.concat_tables(self._tables)
        writer.write_table(batch if batch.schema == writer.schema else batch.cast(writer.schema),
                           row_group_size=max(batch.num_rows, 1))
        self._tables, self._tables_bytes = [], 0

    def _open(self, schema: Any) -> Any:
        import pyarrow.parquet as pq

        if self._writer is None:
            path = self.build / DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(path, schema=schema, compression="snappy", use_dictionary=True)
            self.files.append(path)
        return self._writer

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._schema is None:
            self._schema = data_schema(self.features)
        table = _arrow_table(self._pending, self._schema)
        self._open(table.schema)
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
        self._flush_tables()
        had_file = self._writer is not None
        self._close_file()
        return next_file(self.chunk, self.file) if had_file else (self.chunk, self.file)


def episode_frames(ep: StagedEpisode, index: int, first_frame: int, task_index: int, fps: int,
                    record: Mapping[str, Any], outcomes: bool = True) -> dict[str, Any]:
    n = len(ep.action)
    cols: dict[str, Any] = {name: values.astype(np.float32) for name, values in ep.state.items()}
    cols["action"] = ep.action.astype(np.float32)
    cols["next.reward"] = ep.reward.astype(np.float32)
    if outcomes:
        done = (ep.annotations[:, ANNOTATION_KEYS.index("terminated")] != 0) | \
            (ep.annotations[:, ANNOTATION_KEYS.index("truncated")] != 0)
        if n:
            done[-1] = True  # a recorded episode ends at its last frame
        cols["next.success"] = done & bool(record.get("success"))
        cols["next.done"] = done
    for i, key in enumerate(ANNOTATION_KEYS):
        cols[annotation_key(key)] = ep.annotations[:, i].astype(np.int64)
    # str(): a Recorder before 57 recorded any instruction= it was given (a number): such a store still exports
    subtasks = [{"role": "assistant", "content": str(s.get("instruction") or s["name"]), "style": "subtask",
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


def _arrow_column(values: Any, typ: Any, rows: int) -> Any:
    """One column of ``rows`` rows as arrow: numbers straight from numpy (a vector feature is a fixed-size
    list), and a per-episode constant (the language columns: one list per frame, all equal) converted once
    and repeated."""
    import pyarrow as pa

    if isinstance(values, np.ndarray):
        if pa.types.is_fixed_size_list(typ):
            inner = _arrow_column(values.reshape(-1, *values.shape[2:]), typ.value_type, len(values) * typ.list_size)
            return pa.FixedSizeListArray.from_arrays(inner, type=typ)
        return pa.array(values.reshape(rows), type=typ)
    first = values[0] if rows else None
    constant = all(v is first for v in values) or all(v == first for v in values)
    # pyarrow converts Python values only to plain types: build with the extension types' storage (the JSON
    # of ``tool_calls`` is text), then cast to the schema's types.
    column = pa.array([first] if constant else list(values), type=_storage_type(typ)).cast(typ)
    return column.take(pa.array(np.zeros(rows, dtype=np.int64))) if constant else column


@functools.cache
def _storage_type(typ: Any) -> Any:
    """``typ`` with every extension type replaced by its storage type."""
    import pyarrow as pa

    if isinstance(typ, pa.BaseExtensionType):
        return _storage_type(typ.storage_type)
    if pa.types.is_struct(typ):
        return pa.struct([f.with_type(_storage_type(f.type)) for f in typ])
    if pa.types.is_large_list(typ):
        return pa.large_list(typ.value_field.with_type(_storage_type(typ.value_type)))
    if pa.types.is_list(typ):
        return pa.list_(typ.value_field.with_type(_storage_type(typ.value_type)))
    return typ


def _arrow_table(rows: Sequence[Mapping[str, Any]], schema: Any) -> Any:
    """Episodes' columns as one arrow table of ``schema``: built from the numpy arrays directly, which is what
    ``datasets.Dataset.from_dict`` stores for them (a test compares the two), without its per-value Python
    conversion."""
    import pyarrow as pa

    chunks = [[_arrow_column(r[field.name], field.type, len(r["index"])) for r in rows] for field in schema]
    return pa.Table.from_arrays([pa.concat_arrays(c) for c in chunks], schema=schema)


def _stats_columns(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    return {f"stats/{feature}/{name}": np.asarray(value).tolist()
            for feature, per in stats.items() for name, value in per.items()}


@dataclass(frozen=True)
class EpisodeMetaRow:
    """One exported episode's row of ``meta/episodes``: its indices, where its data rows and video lie, and
    its statistics (collected over an export, written when its episodes are all in)."""

    episode_index: int
    task: str
    length: int
    dataset_from_index: int
    dataset_to_index: int
    data_file: tuple[int, int]  # (chunk, file) of the data parquet holding its rows
    videos: Mapping[str, tuple[int, int, float, float]]  # video key: chunk, file, from and to timestamp
    stats: Mapping[str, FeatureStats]
    subtasks: Mapping[str, list[Any]] = field(default_factory=dict)  # LeRobot's sub-task columns (subtasks.py)

    def record(self, meta_file: tuple[int, int]) -> dict[str, Any]:
        """The row as LeRobot's writer lays it out (column names and order)."""
        return {"episode_index": self.episode_index, "tasks": [self.task], "length": self.length,
                "data/chunk_index": self.data_file[0], "data/file_index": self.data_file[1],
                "dataset_from_index": self.dataset_from_index, "dataset_to_index": self.dataset_to_index,
                **{f"videos/{key}/{name}": value for key, span in self.videos.items()
                   for name, value in zip(("chunk_index", "file_index", "from_timestamp", "to_timestamp"), span)},
                **_stats_columns(self.stats),
                "meta/episodes/chunk_index": meta_file[0], "meta/episodes/file_index": meta_file[1],
                **self.subtasks}


def write_episode_meta(build: Path, rows: Sequence[EpisodeMetaRow], start: Sequence[int]
                       ) -> tuple[tuple[int, int], list[Path]]:
    """Write the rows as one ``meta/episodes`` file at cursor ``start``; returns the next cursor and the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk, file = int(start[0]), int(start[1])
    table = pa.Table.from_pylist([row.record((chunk, file)) for row in rows])
    for name, typ in arrow_types().items():  # typed, whatever the values (an empty list has no type of its own)
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, table[name].cast(typ))
    path = build / EPISODES_PATH.format(chunk_index=chunk, file_index=file)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")
    return next_file(chunk, file), [path]


def write_episode_table(build: Path, table: Any, start: Sequence[int]) -> tuple[tuple[int, int], list[Path]]:
    """Write finished episode-metadata rows (an arrow table: an edit's rows, copied and renumbered) as one
    ``meta/episodes`` file at cursor ``start``; returns the next cursor and the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk, file = int(start[0]), int(start[1])
    for name, value in (("meta/episodes/chunk_index", chunk), ("meta/episodes/file_index", file)):
        column = pa.array([value] * table.num_rows, type=pa.int64())
        table = table.set_column(table.column_names.index(name), name, column) if name in table.column_names \
            else table.append_column(name, column)
    path = build / EPISODES_PATH.format(chunk_index=chunk, file_index=file)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")
    return next_file(chunk, file), [path]


def episode_stats(ep: StagedEpisode, frames: Mapping[str, Any], cameras: Sequence[CameraSpec],
                  depth: DepthVideoIdentity | None = None, cache: dict[tuple[str, bytes], FeatureStats] | None = None
                  ) -> dict[str, FeatureStats]:
    """LeRobot's per-episode statistics of every feature of one exported episode, in feature order.

    Episodes staged in format 3 carry them (computed while they were recorded); for older ones they are
    computed now, the cameras' from the staged video. The automatic columns' (``timestamp``, ``index``, ...)
    depend on where the episode lands in the dataset: computed here from ``frames``, the episode's columns
    (``cache`` keeps those that depend only on the length, for the next episodes of an export)."""
    recorded = ep.recorded_stats() or legacy_stats(ep, cameras, depth)
    stats: dict[str, FeatureStats] = dict(recorded.state)
    stats["action"] = recorded.action
    stats["next.reward"] = recorded.reward
    stats |= {annotation_key(k): v for k, v in recorded.annotations.items()}
    for key in OUTCOME_COLUMNS:  # derived at export from the annotations and the outcome
        if key in frames:
            stats[key] = vector_stats(np.asarray(frames[key]))
    for key in AUTOMATIC_COLUMNS:
        values = np.asarray(frames[key])
        if cache is None or key not in ("frame_index", "timestamp"):
            stats[key] = vector_stats(values)
        else:  # these depend only on the episode's length (and fps): once per length in an export
            stats[key] = cache.get((key, values.tobytes())) or cache.setdefault((key, values.tobytes()),
                                                                                vector_stats(values))
    stats |= {camera_key(c.name): recorded.cameras[c.name] for c in cameras}
    return stats


def legacy_stats(ep: StagedEpisode, cameras: Sequence[CameraSpec], depth: DepthVideoIdentity | None) -> EpisodeStats:
    """The statistics of an episode staged before they were recorded (formats 1 and 2): the numeric arrays'
    from the staged data, each camera's from LeRobot's frame sample decoded from the staged video (the only
    copy of the frames left; depth dequantized to metres by LeRobot's ``dequantize_depth``)."""
    length = len(ep.action)
    wanted = sample_indices(length)
    per_camera: dict[str, FeatureStats] = {}
    for camera in cameras:
        data = ep.video[camera.name]
        if camera.is_depth:
            if depth is None:
                raise ExportError(f"camera {camera.name!r} is a depth camera but the job records no depth settings")
            codes = decode_codes(data, wanted)
            per_camera[camera.name] = depth_stats(np.stack([strided(dequantize(codes[i], depth)) for i in wanted]))
        else:
            decoded = decode_indices(data, wanted)
            missing = sorted(set(wanted) - set(decoded))
            if missing:
                raise ExportError(f"camera {camera.name!r}: the staged video lacks frame(s) {missing[:5]}")
            per_camera[camera.name] = rgb_stats(strided(decoded[i]) for i in wanted)
    return EpisodeStats.compute(ep.state, ep.action, ep.reward, ep.annotations, per_camera)


def write_stats_file(build: Path, new: Sequence[Mapping[str, Mapping[str, np.ndarray]]], has_old: bool) -> Path:
    parts = list(new)
    path = build / STATS
    if has_old:
        old = read_stats(path)
        if old:
            parts.insert(0, old)
    stats = aggregate_stats(parts)
    return replace_file(path, stats_json_text(stats).encode())  # may be a hard link to the published version


def write_tasks(build: Path, tasks: Mapping[str, int]) -> list[Path]:
    import pandas as pd

    path = build / TASKS
    unlink_shared(path)
    df = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks.keys()), name="task"))
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path)
    return [path]


def info_json(features: Mapping[str, dict], fps: int, episodes: int, frames: int, tasks: int,
              robot_type: str | None = None) -> dict[str, Any]:
    """``meta/info.json`` of an exported version (what LeRobot's writer would write for these features)."""
    return {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": features, "total_episodes": episodes,
            "total_frames": frames, "total_tasks": tasks, "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB,
            "data_path": DATA_PATH, "video_path": VIDEO_PATH,
            "robot_type": robot_type, "splits": {"train": f"0:{episodes}"}}
