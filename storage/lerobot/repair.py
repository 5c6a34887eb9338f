"""``demoforge repair``: bring back a LeRobot v3.0 dataset that LeRobot's own writer left broken by a crash.

LeRobot 0.6.1's writer keeps the data Parquet file open until ``finalize()`` (no footer before it), buffers
the episode metadata ten episodes at a time, and rewrites ``info.json`` and ``stats.json`` in place; a killed
recording does not load. What survives (docs/reliability.md, measured with tools/lerobot_kill_harness.py):
every saved episode's rows as whole row groups, and its frames in the camera files (appended by rename).

Repair reads what is on disk and keeps exactly the episodes that are whole: rows complete and consistent
(frame and global indices, timestamps, a known task) and every camera holding all their frames. Nothing is
padded or guessed: an episode that is not whole is dropped and named with the reason. The metadata is rebuilt
with LeRobot's own writer of metadata (``LeRobotDatasetMetadata``: episodes, info, statistics, tasks); the
rows are the recovered ones, and the video files are copied, never re-encoded. Statistics are the original
ones where the episode metadata survived, else LeRobot's, computed from the rows and the decoded frames.
The result is published atomically: built beside the target, fsynced, then renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from demoforge.storage.durable import FsyncPool, fsync_dir
from demoforge.storage.lerobot.parquet_footer import FooterRebuildError, has_footer, read_without_footer
from demoforge.storage.scheduling import normal_priority
from demoforge.storage.video import count_frames, decode_indices


class RepairError(ValueError):
    """The dataset cannot be repaired as asked (not a LeRobot v3.0 dataset, an unreadable file repair needs,
    a target that exists); nothing was written."""


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode found on disk: kept (``recovered``) or dropped, and why."""

    episode_index: int
    frames: int
    recovered: bool
    reason: str
    new_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"episode_index": self.episode_index, "frames": self.frames, "recovered": self.recovered,
                "reason": self.reason, "new_index": self.new_index}


@dataclass(frozen=True)
class RepairReport:
    dataset: Path
    out: Path | None  # where the repaired dataset is (None: nothing written)
    healthy: bool
    episodes: tuple[EpisodeOutcome, ...]
    findings: tuple[str, ...]  # what was broken, one line each
    backup: Path | None = None  # --in-place: where the broken dataset was moved
    elapsed_s: float = 0.0

    @property
    def recovered(self) -> int:
        return sum(1 for e in self.episodes if e.recovered)

    @property
    def lost(self) -> tuple[EpisodeOutcome, ...]:
        return tuple(e for e in self.episodes if not e.recovered)

    def to_json(self) -> dict[str, Any]:
        return {"dataset": str(self.dataset), "out": str(self.out) if self.out else None, "healthy": self.healthy,
                "recovered": self.recovered, "lost": len(self.lost), "findings": list(self.findings),
                "backup": str(self.backup) if self.backup else None, "elapsed_s": round(self.elapsed_s, 3),
                "episodes": [e.to_json() for e in self.episodes]}


@dataclass
class _Episode:
    index: int
    rows: pa.Table
    data_file: tuple[int, int]  # (chunk, file) of the data file its rows came from
    meta: dict[str, Any] | None = None  # its row of meta/episodes, when that survived
    videos: dict[str, tuple[int, int, float, float]] = field(default_factory=dict)  # key -> chunk, file, from, to
    pngs: dict[str, Path] = field(default_factory=dict)  # key -> its complete PNG folder, encoded by repair
    problem: str | None = None


def _fsync_tree(root: Path) -> None:
    """Every file, then every folder of a built dataset: all of it is on disk before the rename that publishes
    it (one concurrent batch, as a dataset version is published)."""
    walked = list(os.walk(root))
    with FsyncPool() as pool:
        pool.fsync_all([Path(folder) / name for folder, _dirs, files in walked for name in files],
                       [Path(folder) for folder, _dirs, _files in walked])


def _chunk_file(path: Path) -> tuple[int, int]:
    return int(path.parent.name.split("-")[1]), int(path.stem.split("-")[1])


def _read_info(root: Path) -> dict[str, Any]:
    path = root / "meta" / "info.json"
    if not root.is_dir():
        raise RepairError(f"{root} is not a directory")
    if not path.is_file():
        raise RepairError(f"{root} is not a LeRobot dataset: meta/info.json is missing")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RepairError(f"{path}: not readable JSON ({exc}); repair needs the features it lists") from None
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict) or "fps" not in info:
        raise RepairError(f"{path}: no 'features' and 'fps': not a LeRobot dataset's info.json")
    if info.get("codebase_version") != "v3.0":
        raise RepairError(f"{root} is a LeRobot {info.get('codebase_version')!r} dataset; repair reads v3.0 "
                          "(LeRobot 0.4 and later): convert it with LeRobot's converter first")
    images = [k for k, ft in info["features"].items() if isinstance(ft, dict) and ft.get("dtype") == "image"]
    if images:
        raise RepairError(f"{root} stores {', '.join(images)} as images inside the data files; repair handles "
                          "video cameras only")
    return info


def _features(info: dict[str, Any]) -> dict[str, dict]:
    return {k: {**ft, "shape": tuple(ft["shape"])} for k, ft in info["features"].items()}


def _read_data(root: Path, schema: pa.Schema, findings: list[str]) -> list[tuple[Path, pa.Table]]:
    tables = []
    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not files:
        raise RepairError(f"{root} has no data files (data/chunk-*/file-*.parquet): no episode reached the disk")
    for path in files:
        rel = path.relative_to(root)
        if has_footer(path):
            try:
                tables.append((path, pq.read_table(path)))
                continue
            except (pa.ArrowException, OSError) as exc:
                findings.append(f"{rel}: has a footer but does not read ({exc}); its row groups are read one by one")
        try:
            recovered = read_without_footer(path, schema)
        except FooterRebuildError as exc:
            findings.append(f"{rel}: no episode could be read ({exc})")
            continue
        findings.append(f"{rel}: no footer (the writer never reached finalize); {recovered.row_groups} whole row "
                        f"group(s), {recovered.table.num_rows} rows" +
                        (f", {recovered.trailing_bytes} bytes of a row group cut short" if recovered.trailing_bytes
                         else ""))
        tables.append((path, recovered.table.cast(schema)))
    return tables


def _read_episode_metadata(root: Path, findings: list[str]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError):
            findings.append(f"{path.relative_to(root)}: no footer (LeRobot writes it at finalize); the episodes it "
                            "lists are rebuilt from the data and video files")
            continue
        for row in table.to_pylist():
            rows[int(row["episode_index"])] = row
    return rows


def _frame_counts(root: Path, key: str, findings: list[str]) -> list[tuple[tuple[int, int], int]]:
    """((chunk, file), frames it holds) of each of a camera's files, in order."""
    import av

    out = []
    for path in sorted((root / "videos" / key).glob("chunk-*/file-*.mp4")):
        try:
            frames = count_frames(path)
        except (av.error.FFmpegError, IndexError, OSError) as exc:
            findings.append(f"{path.relative_to(root)}: unreadable ({exc}); the episodes in it are lost")
            frames = 0
        out.append((_chunk_file(path), frames))
    return out


def _split_episodes(tables: list[tuple[Path, pa.Table]], fps: int, task_count: int) -> list[_Episode]:
    episodes: list[_Episode] = []
    next_index = 0
    for path, table in tables:
        if table.num_rows == 0:
            continue
        column = np.asarray(table.column("episode_index").to_numpy(zero_copy_only=False)).reshape(-1)
        starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
        for start, stop in zip(starts, [*starts[1:], len(column)]):
            rows = table.slice(int(start), int(stop - start))
            episode = _Episode(int(column[start]), rows, _chunk_file(path))
            frames = np.asarray(rows.column("frame_index").to_numpy(zero_copy_only=False)).reshape(-1)
            index = np.asarray(rows.column("index").to_numpy(zero_copy_only=False)).reshape(-1)
            stamps = np.asarray(rows.column("timestamp").to_numpy(zero_copy_only=False)).reshape(-1)
            tasks = np.asarray(rows.column("task_index").to_numpy(zero_copy_only=False)).reshape(-1)
            if not np.array_equal(frames, np.arange(len(frames))):
                episode.problem = "its frame_index does not run 0, 1, 2, ... (rows missing or out of order)"
            elif not np.array_equal(index, np.arange(next_index, next_index + len(index))):
                episode.problem = f"its global index does not continue at {next_index}"
            elif not np.allclose(stamps, frames / fps, atol=1e-4):
                episode.problem = "its timestamps are not frame_index / fps"
            elif tasks.min() < 0 or tasks.max() >= task_count:
                episode.problem = f"a task_index is not in meta/tasks.parquet ({task_count} task(s))"
            next_index = int(index[-1]) + 1 if len(index) else next_index
            episodes.append(episode)
    return episodes


def _place_videos(episodes: list[_Episode], root: Path, video_keys: list[str], fps: int,
                  findings: list[str], encode_codec: str | None) -> None:
    """Find each episode's frames in each camera's files: where the surviving metadata says, else after the
    previous episode's (LeRobot appends episodes in order, starting a new file when one is full)."""
    for key in video_keys:
        files = _frame_counts(root, key, findings)
        if not files:
            findings.append(f"videos/{key}: no video file (frames never encoded: LeRobot's batch encoding "
                            "had not run); the episodes' frames are lost")
        position = 0  # index into files
        used = 0  # frames of files[position] taken by earlier episodes
        for episode in episodes:
            length = episode.rows.num_rows
            meta = episode.meta
            if meta is not None and f"videos/{key}/chunk_index" in meta:
                where = (int(meta[f"videos/{key}/chunk_index"]), int(meta[f"videos/{key}/file_index"]))
                begin = float(meta[f"videos/{key}/from_timestamp"])
                holding = next((n for cf, n in files if cf == where), 0)
                if round(begin * fps) + length > holding:
                    episode.problem = episode.problem or f"{key}: its file holds {holding} frames, the episode " \
                                                         f"ends at frame {round(begin * fps) + length}"
                episode.videos[key] = (*where, begin, float(meta[f"videos/{key}/to_timestamp"]))
                position = next((i for i, (cf, _) in enumerate(files) if cf == where), position)
                used = round(begin * fps) + length
                continue
            while position < len(files) - 1 and used >= files[position][1]:
                position, used = position + 1, 0
            holding = files[position][1] - used if files else 0
            if holding >= length:
                chunk, file = files[position][0]
                episode.videos[key] = (chunk, file, used / fps, (used + length) / fps)
                used += length
                continue
            used += length
            folder = root / "images" / key / f"episode-{episode.index:06d}"
            pngs = sorted(p.name for p in folder.glob("frame-*.png")) if folder.is_dir() else []
            whole = pngs == [f"frame-{i:06d}.png" for i in range(length)]
            if whole and encode_codec is not None:
                episode.pngs[key] = folder
            elif episode.problem is None:
                episode.problem = f"{key}: {max(holding, 0)} of its {length} frames are in a video file" + (
                    "; its frames are PNGs LeRobot had not encoded yet (batch encoding): --encode-pngs encodes "
                    "them" if whole else f" and {len(pngs)} are PNGs (the recording stopped before its video "
                    "was written)")


def _is_healthy(tables: list[tuple[Path, pa.Table]], meta_rows: dict[int, dict[str, Any]], info: dict[str, Any],
                episodes: list[_Episode], findings: list[str]) -> bool:
    if findings or any(e.problem for e in episodes):
        return False
    lengths = {e.index: e.rows.num_rows for e in episodes}
    if {i: int(r["length"]) for i, r in meta_rows.items()} != lengths:
        findings.append("meta/episodes does not list the episodes the data files hold "
                        f"({len(meta_rows)} listed, {len(lengths)} in the data)")
        return False
    if info.get("total_episodes") != len(lengths) or info.get("total_frames") != sum(lengths.values()):
        findings.append(f"meta/info.json counts {info.get('total_episodes')} episodes / {info.get('total_frames')} "
                        f"frames; the data holds {len(lengths)} / {sum(lengths.values())}")
        return False
    return True


def _video_stats(root: Path, info: dict[str, Any], key: str, where: tuple[int, int, float, float], length: int,
                 feature: dict[str, Any]) -> dict[str, np.ndarray]:
    """LeRobot's statistics of one episode's camera (``compute_episode_stats``: sampled frames, downsampled,
    per channel, scaled to [0, 1]), from the decoded frames."""
    from lerobot.datasets.compute_stats import auto_downsample_height_width, get_feature_stats, sample_indices

    chunk, file, begin, _ = where
    path = root / info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
    first = round(begin * info["fps"])
    frames = decode_indices(path, [first + i for i in sorted(set(sample_indices(length)))])
    images = [auto_downsample_height_width(frames[n].transpose(2, 0, 1)) for n in sorted(frames)]
    stats = get_feature_stats(np.stack(images), axis=(0, 2, 3), keepdims=True)
    scale = 1.0 if (feature.get("info") or {}).get("is_depth_map") else 255.0
    return {k: v if k == "count" else np.squeeze(v / scale, axis=0) for k, v in stats.items()}


def _episode_stats(root: Path, info: dict[str, Any], features: dict[str, dict], episode: _Episode
                   ) -> dict[str, dict[str, np.ndarray]]:
    from lerobot.datasets.compute_stats import compute_episode_stats

    numeric = {k: ft for k, ft in features.items() if ft["dtype"] not in ("video", "image", "string", "language")}
    data = {}
    for key in numeric:
        values = np.stack([np.asarray(v) for v in episode.rows.column(key).to_pylist()])
        data[key] = values.reshape(len(values)) if tuple(features[key]["shape"]) == (1,) else values
    stats = compute_episode_stats(data, numeric)
    for key, where in episode.videos.items():
        if key in episode.pngs:  # LeRobot's own statistics of the frames it kept as PNGs
            paths = [str(episode.pngs[key] / f"frame-{i:06d}.png") for i in range(episode.rows.num_rows)]
            stats.update(compute_episode_stats({key: paths}, {key: features[key]}))
        else:
            stats[key] = _video_stats(root, info, key, where, episode.rows.num_rows, features[key])
    return stats


def _stats_from_meta(row: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    stats: dict[str, dict[str, np.ndarray]] = {}
    for column, value in row.items():
        if column.startswith("stats/") and value is not None:
            feature, name = column[len("stats/"):].rsplit("/", 1)
            stats.setdefault(feature, {})[name] = np.asarray(value)
    return stats


def _encode_pngs(root: Path, scratch: Path, info: dict[str, Any], features: dict[str, dict],
                 kept: list[_Episode], codec: str | None) -> dict[Path, Path]:
    """Encode the episodes whose frames are only PNGs, as LeRobot's batch encoding would have (its own
    ``encode_video_frames`` per episode, then ``concatenate_video_files``), into a new file per camera after
    the camera's last one; sets their places and the camera's video info. Returns relative path -> file."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.video_utils import concatenate_video_files, encode_video_frames, get_video_info

    out: dict[Path, Path] = {}
    fps = int(info["fps"])
    for key in [k for k, ft in features.items() if ft["dtype"] == "video"]:
        episodes = [e for e in kept if key in e.pngs]
        if not episodes or codec is None:
            continue
        existing = sorted((root / "videos" / key).glob("chunk-*/file-*.mp4"))
        chunk, file = _chunk_file(existing[-1]) if existing else (0, -1)
        file += 1
        scratch.mkdir(parents=True, exist_ok=True)
        parts = []
        begin = 0
        for episode in episodes:
            part = scratch / f"{key}-{episode.index:06d}.mp4"
            with normal_priority():  # LeRobot's encoder is SVT-AV1 by default: as root it asks for SCHED_FIFO 99
                encode_video_frames(episode.pngs[key], part, fps, RGBEncoderConfig(vcodec=codec))
            parts.append(part)
            length = episode.rows.num_rows
            episode.videos[key] = (chunk, file, begin / fps, (begin + length) / fps)
            begin += length
        joined = scratch / f"{key}.mp4"
        concatenate_video_files(parts, joined)
        out[Path(info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file))] = joined
        if not features[key].get("info"):
            features[key] = {**features[key], "info": get_video_info(joined)}
    return out


def _build(root: Path, build: Path, info: dict[str, Any], features: dict[str, dict], kept: list[_Episode],
           tasks: Any, progress: Callable[[int, int], None], encode_codec: str | None) -> None:
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.datasets.io_utils import write_table_one_row_group_per_episode, write_tasks

    encoded = _encode_pngs(root, build.with_name(build.name + "-videos"), info, features, kept, encode_codec)
    meta = LeRobotDatasetMetadata.create(
        repo_id=f"repaired/{root.name}", fps=int(info["fps"]), features=features, robot_type=info.get("robot_type"),
        root=build, use_videos=any(ft["dtype"] == "video" for ft in features.values()),
        chunks_size=info.get("chunks_size"), data_files_size_in_mb=info.get("data_files_size_in_mb"),
        video_files_size_in_mb=info.get("video_files_size_in_mb"))
    meta.tasks = tasks
    write_tasks(tasks, build)
    by_file: dict[tuple[int, int], list[pa.Table]] = {}
    renumbered = any(e.index != i for i, e in enumerate(kept))
    start = 0
    for new_index, episode in enumerate(kept):
        rows = episode.rows
        if renumbered:
            length = rows.num_rows
            rows = rows.set_column(rows.schema.get_field_index("episode_index"), "episode_index",
                                   pa.array([new_index] * length, rows.schema.field("episode_index").type))
            rows = rows.set_column(rows.schema.get_field_index("index"), "index",
                                   pa.array(np.arange(start, start + length), rows.schema.field("index").type))
        by_file.setdefault(episode.data_file, []).append(rows)
        start += rows.num_rows
    for (chunk, file), parts in by_file.items():
        path = build / info["data_path"].format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table_one_row_group_per_episode(pa.concat_tables(parts), path)
    for relative, path in encoded.items():
        (build / relative).parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, build / relative)
    shutil.rmtree(build.with_name(build.name + "-videos"), ignore_errors=True)
    copied: set[Path] = set(encoded)
    for episode in kept:
        for key, (chunk, file, _, _) in episode.videos.items():
            relative = Path(info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file))
            if relative not in copied:
                (build / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / relative, build / relative)
                copied.add(relative)
    start = 0
    for new_index, episode in enumerate(kept):
        length = episode.rows.num_rows
        stats = _stats_from_meta(episode.meta) if episode.meta is not None else {}
        if set(stats) != {k for k, ft in features.items() if ft["dtype"] not in ("string", "language")}:
            stats = _episode_stats(build, info, features, episode)  # the copied videos
        task_ids = sorted(set(np.asarray(episode.rows.column("task_index").to_numpy(zero_copy_only=False))
                              .reshape(-1).tolist()))
        names = [str(tasks.index[tasks["task_index"] == t][0]) for t in task_ids]
        chunk, file = episode.data_file
        metadata: dict[str, Any] = {"data/chunk_index": chunk, "data/file_index": file,
                                    "dataset_from_index": start, "dataset_to_index": start + length}
        for key, (v_chunk, v_file, begin, end) in episode.videos.items():
            metadata.update({f"videos/{key}/chunk_index": v_chunk, f"videos/{key}/file_index": v_file,
                             f"videos/{key}/from_timestamp": begin, f"videos/{key}/to_timestamp": end})
        meta.save_episode(new_index, length, names, stats, metadata)
        start += length
        progress(new_index + 1, len(kept))
    meta.finalize()


def repair_dataset(dataset: Path | str, out: Path | str | None = None, *, in_place: bool = False,
                   dry_run: bool = False, encode_pngs: bool = False, vcodec: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> RepairReport:
    """Repair ``dataset`` into ``out`` (default ``<dataset>-repaired``), or in place (the broken dataset is kept
    beside it as ``<name>.broken-<time>``). A healthy dataset is left alone and nothing is written.

    ``encode_pngs``: episodes whose frames are whole PNG folders that LeRobot had not encoded yet (streaming
    off, ``batch_encoding_size`` > 1) are encoded with ``vcodec`` (None: the codec info.json records, else
    LeRobot's default); without it they are dropped and named."""
    started = time.monotonic()
    root = Path(dataset)
    if in_place and out is not None:
        raise RepairError("--in-place and --out exclude each other")
    target = root if in_place else Path(out) if out is not None else root.with_name(root.name + "-repaired")
    if not in_place and target.exists():
        raise RepairError(f"{target} exists; repair writes a new dataset (give another --out, or --in-place)")
    info = _read_info(root)
    from lerobot.datasets.feature_utils import get_hf_features_from_features
    from lerobot.datasets.io_utils import load_tasks

    features = _features(info)
    fps = int(info["fps"])
    schema = get_hf_features_from_features(features).arrow_schema
    findings: list[str] = []
    try:
        tasks = load_tasks(root)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise RepairError(f"{root / 'meta' / 'tasks.parquet'} does not read ({exc}); the task of each frame is "
                          "known only from it") from None
    tables = _read_data(root, schema, findings)
    meta_rows = _read_episode_metadata(root, findings)
    episodes = _split_episodes(tables, fps, len(tasks))
    for episode in episodes:
        episode.meta = meta_rows.get(episode.index)
    video_keys = [k for k, ft in features.items() if ft["dtype"] == "video"]
    recorded = {(ft.get("info") or {}).get("video.codec") for k, ft in features.items() if k in video_keys} - {None}
    encode_codec = (vcodec or (recorded.pop() if len(recorded) == 1 else "libsvtav1")) if encode_pngs else None
    _place_videos(episodes, root, video_keys, fps, findings, encode_codec)
    healthy = _is_healthy(tables, meta_rows, info, episodes, findings)
    kept = [e for e in episodes if e.problem is None]
    new_index = {e.index: i for i, e in enumerate(kept)}
    def why_kept(episode: _Episode) -> str:
        if episode.pngs:
            return f"rows whole; frames encoded from its PNGs with {encode_codec}"
        return "rows and video whole" + ("" if episode.meta is not None else "; metadata rebuilt")

    outcomes = tuple(EpisodeOutcome(e.index, e.rows.num_rows, e.problem is None, e.problem or why_kept(e),
                                    new_index.get(e.index)) for e in episodes)
    leftovers = sorted(p.name for p in root.glob("tmp*") if p.is_dir()) + \
        (["images/"] if (root / "images").is_dir() else [])
    if leftovers:
        findings.append(f"left by the interrupted episode, not part of any saved one: {', '.join(leftovers)}")
    if healthy or dry_run or not kept:
        return RepairReport(root, None, healthy, outcomes, tuple(findings), elapsed_s=time.monotonic() - started)
    build = target.with_name(f".{target.name}.repair-{os.getpid()}")
    if build.exists():
        shutil.rmtree(build)
    try:
        _build(root, build, info, features, kept, tasks, progress or (lambda done, total: None), encode_codec)
        _fsync_tree(build)
        backup = None
        if in_place:
            backup = root.with_name(f"{root.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")
            os.rename(root, backup)
        os.rename(build, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(build.with_name(build.name + "-videos"), ignore_errors=True)
        raise
    return RepairReport(root, target, False, outcomes, tuple(findings), backup, time.monotonic() - started)
