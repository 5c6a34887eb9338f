"""Export committed episodes of a staging store into a LeRobot v3.0 dataset, atomically and incrementally.

Publishing: ``OUT`` is a symbolic link to ``OUT.versions/vNNNNNN``, a complete dataset. An export builds the
next version beside it — hard links to every unchanged file of the current version, new files for the new
episodes (data parquet, one mp4 per camera, episode metadata) and rewritten small metadata (info, stats,
tasks, sidecar) — fsyncs it, then swaps the link with one ``rename(2)``. LeRobot's reader globs whole
folders, so renaming files one at a time into a live folder could never be atomic for readers; swapping a
link is. A crash leaves the old version published; the next export removes unfinished version folders.

Exactly once: the published ``meta/demoforge.json`` lists every exported staging episode with its dataset
index; it is the truth, and the catalog's ``exported`` state is reconciled from it.

No re-encoding: each camera's staged fragmented-MP4 stream is remuxed (packet copy, timestamps shifted)
into the shared per-camera mp4 of this export.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

from demoforge.pipeline.contract import ANNOTATION_KEYS, SCHEMA_VERSION
from demoforge.storage.catalog import AttemptRow, Catalog
from demoforge.storage.staging import StagedEpisode, StagingCorruptError, StagingStore, fsync_dir, fsync_file
from demoforge.storage.store import layout_from_fingerprint, open_catalog_readonly, path_problem, short_path
from demoforge.storage.verify import check_episode

MARKER = "meta/demoforge.json"
SIDECAR = "meta/demoforge_episodes.jsonl"
EXPORT_FORMAT = 1
CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_MB = 100
VIDEO_FILE_MB = 200
KEEP_VERSIONS = 2
STATS_IMAGE_PX = 64  # camera stats are computed on frames strided down to about this size


class ExportError(RuntimeError):
    """The export cannot proceed; nothing was modified."""


class NotOurDatasetError(ExportError):
    """The target exists and is not a dataset written by demoforge."""


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


# ------------------------------------------------------------------------------------------- schema
def camera_key(camera: str) -> str:
    return f"observation.images.{camera}"


def dataset_features(fingerprint: Mapping[str, Any], video_info: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    """LeRobot features of an export: states, action, reward, annotations, cameras, language, then the
    automatic columns (timestamp, frame_index, episode_index, index, task_index)."""
    from lerobot.datasets.language import language_feature_info

    features: dict[str, dict] = {}
    for name, shape in fingerprint["state_shapes"].items():
        features[name] = {"dtype": "float32", "shape": list(shape), "names": None}
    features["action"] = {"dtype": "float32", "shape": list(fingerprint["action_shape"]), "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ANNOTATION_KEYS:
        features[f"annotation.{key}"] = {"dtype": "int64", "shape": [1], "names": None}
    for camera, height, width in fingerprint["cameras"]:
        features[camera_key(camera)] = {"dtype": "video", "shape": [height, width, 3],
                                        "names": ["height", "width", "channels"],
                                        "info": dict(video_info.get(camera, {}))}
    for key, ft in language_feature_info().items():
        features[key] = {**ft, "shape": list(ft["shape"])}
    for key, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                       ("index", "int64"), ("task_index", "int64")):
        features[key] = {"dtype": dtype, "shape": [1], "names": None}
    return features


def _video_info(fingerprint: Mapping[str, Any], camera: str, height: int, width: int) -> dict[str, Any]:
    video = fingerprint["video"]
    return {"video.height": height, "video.width": width,
            "video.codec": {"libsvtav1": "av1", "libaom-av1": "av1"}.get(video["codec"], video["codec"]),
            "video.pix_fmt": video["pix_fmt"], "video.fps": fingerprint["fps"], "video.channels": 3,
            "has_audio": False, "video.g": video["g"], "video.crf": video["crf"], "video.preset": video["preset"],
            "video.fast_decode": 0, "video.video_backend": "pyav", "video.extra_options": {},
            "is_depth_map": False}


def schema_identity(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """What must match between a store and the dataset it appends to."""
    return {k: fingerprint[k] for k in ("schema_version", "task", "fps", "cameras", "state_shapes",
                                        "action_shape", "video")}


# ---------------------------------------------------------------------------------------- the target
@dataclass
class Published:
    """The currently published version of a dataset (or nothing yet)."""

    root: Path
    versions: Path
    current: Path | None
    marker: dict[str, Any] | None


def resolve_target(out: Path) -> Published:
    out = Path(out)
    problem = path_problem(out, reserve=len(".versions"))
    if problem:
        raise ExportError(f"cannot use {short_path(out)} as a dataset: the path {problem}")
    try:
        return _resolve_target(out)
    except OSError as exc:  # e.g. a path component that is a file, a loop of links, no permission
        raise ExportError(f"cannot use {short_path(out)} as a dataset: {exc.strerror or exc}") from None
    except ValueError as exc:  # an unreadable meta/demoforge.json
        raise NotOurDatasetError(f"{short_path(out)}: its {MARKER} cannot be read ({exc}); refusing to modify it") \
            from None


def _resolve_target(out: Path) -> Published:
    versions = out.parent / f"{out.name}.versions"
    if out.is_symlink():
        current = (out.parent / os.readlink(out)).resolve()
        marker_path = current / MARKER
        if current.parent != versions.resolve() or not marker_path.exists():
            raise NotOurDatasetError(f"{out} links to {current}, which is not a demoforge dataset version")
        return Published(out, versions, current, json.loads(marker_path.read_text()))
    if out.exists():
        if not out.is_dir():
            raise NotOurDatasetError(f"{out} exists and is not a directory")
        if (out / "meta" / "info.json").exists():
            raise NotOurDatasetError(f"{out} is a LeRobot dataset not written by demoforge; refusing to modify it "
                                     "(export to a new directory)")
        if any(out.iterdir()):
            raise NotOurDatasetError(f"{out} is a non-empty directory that is not a demoforge dataset; "
                                     "refusing to write into it")
    return Published(out, versions, None, None)


# ----------------------------------------------------------------------------------------- the export
def export_store(store_dir: Path | str, out: Path | str, *, repo_id: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 stage_pause: Callable[[str], None] | None = None) -> ExportReport:
    """Export every committed, not yet exported episode of ``store_dir`` into the dataset at ``out``.

    ``stage_pause(name)`` is a fault-injection hook called between steps (tests kill the process there).
    """
    started = time.monotonic()
    pause = stage_pause or (lambda _name: None)
    store_dir, out = Path(store_dir), Path(out)
    catalog = open_catalog_readonly(store_dir)
    try:
        fingerprint = catalog.fingerprint()
        if fingerprint is None:
            raise ExportError(f"{store_dir} holds no job yet; nothing to export")
        layout = layout_from_fingerprint(fingerprint)  # refuses unsafe camera / feature names before any write
        target = resolve_target(out)
        if target.marker is not None and target.marker.get("schema") != schema_identity(fingerprint):
            diffs = [k for k, v in schema_identity(fingerprint).items() if target.marker.get("schema", {}).get(k) != v]
            raise SchemaMismatchError(f"{out} was written for a different job (differs in: {', '.join(diffs)}); "
                                      "export to a new directory")
        _check_writable(out.parent)
        lock_fd = _lock_exports(target.versions)
        try:
            _remove_unfinished(target.versions, target.current)
            reconciled = _reconcile(catalog, target.marker)
            staging = StagingStore(store_dir, layout)
            # What the dataset already holds is the published marker's word, not the catalog's: a store
            # can feed a second dataset, and a crash can fall between publishing and the catalog update.
            present = {e["episode_id"] for e in (target.marker or {}).get("episodes", [])}
            rows = [r for r in catalog.attempts(("committed", "exported")) if r.episode_id not in present]
            episodes, quarantined = _load_episodes(catalog, staging, rows)
            if not episodes:
                marker = target.marker or {}
                return ExportReport(out, target.current.name if target.current else None, 0,
                                    int(marker.get("total_episodes", 0)), int(marker.get("total_frames", 0)),
                                    quarantined, reconciled, time.monotonic() - started)
            writer = _VersionWriter(target, fingerprint, repo_id or f"demoforge/{fingerprint['task']}", pause)
            version, marker = writer.write(episodes, progress)
            pause("before_catalog")
            catalog.mark_exported({row.episode_id: idx for (row, _), idx in zip(episodes, writer.new_indices)
                                   if row.state == "committed"})
            _prune_versions(target.versions, keep=KEEP_VERSIONS)
            return ExportReport(out, version, len(episodes), marker["total_episodes"], marker["total_frames"],
                                quarantined, reconciled, time.monotonic() - started)
        finally:
            os.close(lock_fd)
    finally:
        catalog.close()


def _check_writable(parent: Path) -> None:
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {parent}: {exc.strerror}") from exc
    probe = parent / f".demoforge-write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ExportError(f"cannot write to {parent}: {exc.strerror}") from exc


def _lock_exports(versions: Path) -> int:
    import fcntl

    versions.mkdir(parents=True, exist_ok=True)
    fd = os.open(versions / "export.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ExportError(f"another export into {versions.parent} is running") from None
    return fd


def _remove_unfinished(versions: Path, current: Path | None) -> None:
    for path in versions.glob("*.partial"):
        shutil.rmtree(path, ignore_errors=False)
    # A version renamed into place whose link swap never happened (a crash between the two) was never
    # published; left there, it would block this export's rename of the same version number forever.
    for path in versions.glob("v*"):
        if path.is_dir() and (current is None or path.name > current.name):
            shutil.rmtree(path)
    for path in versions.glob(".link-*"):
        path.unlink()


def _reconcile(catalog: Catalog, marker: Mapping[str, Any] | None) -> int:
    """Make the catalog agree with the published dataset (a crash can fall between publish and catalog)."""
    if not marker:
        return 0
    published = {e["episode_id"]: e["dataset_index"] for e in marker.get("episodes", [])}
    pending = {r.episode_id: published[r.episode_id] for r in catalog.attempts(("committed",))
               if r.episode_id in published}
    if pending:
        catalog.mark_exported(pending)
    return len(pending)


def _load_episodes(catalog: Catalog, staging: StagingStore,
                   rows: Sequence[AttemptRow]) -> tuple[list[tuple[AttemptRow, StagedEpisode]], list[str]]:
    """Read and check each committed episode; a corrupt one is quarantined and never exported."""
    good: list[tuple[AttemptRow, StagedEpisode]] = []
    quarantined: list[str] = []
    for row in rows:
        try:
            good.append((row, check_episode(staging, row, decode=False)))
        except StagingCorruptError as exc:
            catalog.quarantine(row.episode_id, f"export: {exc}")
            quarantined.append(row.episode_id)
    return good, quarantined


def _prune_versions(versions: Path, keep: int) -> None:
    done = sorted(p for p in versions.glob("v*") if p.is_dir() and not p.name.endswith(".partial"))
    for old in done[:-keep]:
        shutil.rmtree(old)


def _atomic_link(link: Path, target_name: str) -> None:
    tmp = link.parent / f".link-{link.name}-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target_name, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


# ------------------------------------------------------------------------------------------- writing
def _next_file(chunk: int, file: int) -> tuple[int, int]:
    from lerobot.datasets.utils import update_chunk_file_indices

    return update_chunk_file_indices(chunk, file, CHUNKS_SIZE)


class _VersionWriter:
    """Builds one new dataset version next to the published one."""

    def __init__(self, target: Published, fingerprint: Mapping[str, Any], repo_id: str,
                 pause: Callable[[str], None]) -> None:
        self.target = target
        self.fp = fingerprint
        self.repo_id = repo_id
        self.pause = pause
        self.fps = int(fingerprint["fps"])
        self.cameras = [(c, h, w) for c, h, w in fingerprint["cameras"]]
        self.features = dataset_features(fingerprint, {c: _video_info(fingerprint, c, h, w)
                                                       for c, h, w in self.cameras})
        self.new_indices: list[int] = []

    def write(self, episodes: list[tuple[AttemptRow, StagedEpisode]],
              progress: Callable[[int, int], None] | None) -> tuple[str, dict[str, Any]]:
        old = self.target.marker or {}
        number = int(old.get("version", 0)) + 1
        name = f"v{number:06d}"
        build = self.target.versions / f"{name}.partial"
        build.mkdir(parents=True)
        if self.target.current is not None:
            _hardlink_tree(self.target.current, build)
        self.pause("after_links")
        first_index = int(old.get("total_episodes", 0))
        first_frame = int(old.get("total_frames", 0))
        tasks: dict[str, int] = dict(old.get("tasks", {}))
        cursors = old.get("next_files", {"data": [0, 0], "meta": [0, 0], "videos": {}})
        written: list[Path] = []

        # 1. videos: remux each camera's staged streams into this export's file(s).
        video_spans: dict[str, list[tuple[int, int, float, float]]] = {}
        video_cursors: dict[str, list[int]] = {}
        for camera, _h, _w in self.cameras:
            start = cursors["videos"].get(camera, [0, 0])
            spans, nxt, files = _write_videos(build, camera_key(camera), start, self.fps,
                                              [ep.video[camera] for _row, ep in episodes], [r.frames for r, _ in episodes])
            video_spans[camera], video_cursors[camera] = spans, nxt
            written += files
        self.pause("after_videos")

        # 2. frame data and per-episode metadata.
        data_rows, meta_rows, sidecar = [], [], []
        frame = first_frame
        for offset, (row, ep) in enumerate(episodes):
            index = first_index + offset
            self.new_indices.append(index)
            record = row.record or {}
            instruction = record.get("instruction") or self.fp["task"]
            task_index = tasks.setdefault(instruction, len(tasks))
            data_rows.append(_episode_frames(ep, index, frame, task_index, self.fps, record))
            meta_rows.append({"episode_index": index, "tasks": [instruction], "length": row.frames,
                              "dataset_from_index": frame, "dataset_to_index": frame + row.frames,
                              **{f"videos/{camera_key(c)}/{k}": v for c, _h, _w in self.cameras
                                 for k, v in zip(("chunk_index", "file_index", "from_timestamp", "to_timestamp"),
                                                 video_spans[c][offset])},
                              "_stats": _episode_stats(ep, data_rows[-1], self.features, self.cameras)})
            sidecar.append({**record, "schema_version": SCHEMA_VERSION, "dataset_episode_index": index,
                            "staging_episode_id": row.episode_id, "staging_episode_index": row.episode_index,
                            "length": row.frames, "content_hash": row.content_hash,
                            "task_options": dict(self.fp["task_options"]), "job_seed": self.fp["seed"]})
            frame += row.frames
            if progress is not None:
                progress(offset + 1, len(episodes))
        data_spans, data_next, files = _write_data(build, data_rows, self.features, cursors["data"])
        written += files
        meta_next, files = _write_episode_meta(build, meta_rows, data_spans, cursors["meta"])
        written += files
        self.pause("after_data")

        # 3. small metadata, rewritten whole: tasks, stats, info, sidecar, marker (last).
        written += _write_tasks(build, tasks)
        stats = _aggregate_stats(build, [m["_stats"] for m in meta_rows], bool(old))
        written.append(stats)
        total_episodes, total_frames = first_index + len(episodes), frame
        written.append(_write_info(build, self.features, self.fps, total_episodes, total_frames, len(tasks),
                                   self.fp))
        written.append(_append_jsonl(build / SIDECAR, sidecar))
        marker = {"format": EXPORT_FORMAT, "writer": "demoforge", "version": number, "repo_id": self.repo_id,
                  "schema": schema_identity(self.fp), "total_episodes": total_episodes, "total_frames": total_frames,
                  "tasks": tasks, "next_files": {"data": list(data_next), "meta": list(meta_next),
                                                 "videos": {c: list(v) for c, v in video_cursors.items()}},
                  "episodes": [*old.get("episodes", []),
                               *({"episode_id": r.episode_id, "dataset_index": i}
                                 for (r, _), i in zip(episodes, self.new_indices))]}
        written.append(_write_json(build / MARKER, marker))
        self.pause("before_fsync")
        for path in written:
            fsync_file(path)
        for dirpath, _dirs, _files in os.walk(build):
            fsync_dir(Path(dirpath))
        final = self.target.versions / name
        os.rename(build, final)
        fsync_dir(self.target.versions)
        self.pause("before_publish")
        _atomic_link(self.target.root, os.path.relpath(final, self.target.root.parent))
        return name, marker


def _hardlink_tree(src: Path, dst: Path) -> None:
    for dirpath, _dirs, files in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(Path(dirpath) / name, dst / rel / name)


def _replace_file(path: Path, data: bytes) -> Path:
    """Write a file that may be a hard link shared with the published version: never write through it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def _write_json(path: Path, obj: Any) -> Path:
    return _replace_file(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def _append_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    old = path.read_bytes() if path.exists() else b""
    new = "".join(json.dumps(r, allow_nan=False, sort_keys=True) + "\n" for r in rows).encode()
    return _replace_file(path, old + new)


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
        cols[f"annotation.{key}"] = ep.annotations[:, i].astype(np.int64)
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
                   cameras: Sequence[tuple[str, int, int]]) -> dict[str, dict[str, np.ndarray]]:
    """Per-episode stats through lerobot's own helpers; camera stats from a sample of decoded frames."""
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
    for camera, _h, _w in cameras:
        decoded = _decode_sampled(ep.video[camera], sample_indices(len(ep.action)))
        # Stride to ~64 px (LeRobot strides to ~150 px): pixel statistics barely move, and image stats were 95%
        # of export time at 224x224 (tools/bench_export.py).
        images = np.stack([auto_downsample_height_width(img.transpose(2, 0, 1), target_size=STATS_IMAGE_PX,
                                                        max_size_threshold=2 * STATS_IMAGE_PX) for img in decoded])
        per = get_feature_stats(images, axis=(0, 2, 3), keepdims=True)
        stats[camera_key(camera)] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in per.items()}
    return stats


def _decode_sampled(data: bytes, indices: Sequence[int]) -> list[np.ndarray]:
    wanted = set(int(i) for i in indices)
    out: list[np.ndarray] = []
    with av.open(io.BytesIO(data)) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i in wanted:
                out.append(frame.to_ndarray(format="rgb24"))
    return out


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
    if path.exists():
        path.unlink()  # a hard link to the published version: replace, never write through
    write_stats(stats, build)
    return path


def _write_tasks(build: Path, tasks: Mapping[str, int]) -> list[Path]:
    import pandas as pd
    from lerobot.datasets.utils import DEFAULT_TASKS_PATH

    path = build / DEFAULT_TASKS_PATH
    if path.exists():
        path.unlink()
    df = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks.keys()), name="task"))
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path)
    return [path]


def _write_info(build: Path, features: Mapping[str, dict], fps: int, episodes: int, frames: int, tasks: int,
                fp: Mapping[str, Any]) -> Path:
    from lerobot.datasets.utils import DEFAULT_DATA_PATH, DEFAULT_VIDEO_PATH, INFO_PATH

    info = {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": features, "total_episodes": episodes,
            "total_frames": frames, "total_tasks": tasks, "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB,
            "data_path": DEFAULT_DATA_PATH, "video_path": DEFAULT_VIDEO_PATH,
            "robot_type": fp.get("robot_type"), "splits": {"train": f"0:{episodes}"}}
    return _write_json(build / INFO_PATH, info)
