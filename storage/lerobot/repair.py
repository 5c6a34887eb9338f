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
The result is published atomically: built beside the target, fsynced, then renamed into place
(``storage/lerobot/version_builder.py``).

A dataset demoforge exported (it carries ``meta/demoforge.json``) stays demoforge's: its metadata is rewritten by
the export's own writers (episode rows with their sub-task columns, statistics, tasks, info), its episode records
(``meta/demoforge_episodes.jsonl``) keep the kept episodes, renumbered, and its marker records them with every
file's checksum; the result is published as a dataset version (``NAME.versions/vNNNNNN``, the link swapped), so
``export``, ``edit`` and ``verify`` accept it. An episode repair could not keep is not marked removed: a later
``demoforge export`` of its store adds it back while the store still holds it.

The output is never the source, inside it, or around it (storage/lerobot/output_guard.py), and it is new.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from demoforge.storage.durable import fsync_dir
from demoforge.storage.lerobot.format import (
    MARKER,
    SIDECAR,
    ExportMarker,
    MarkerError,
    PublishedEpisode,
    camera_key,
    next_file,
    read_sidecar,
)
from demoforge.storage.lerobot.output_guard import output_overlap
from demoforge.storage.lerobot.parquet_footer import FooterRebuildError, has_footer, read_without_footer
from demoforge.storage.lerobot.publish import (
    ExportError,
    Published,
    finished_versions,
    lock_exports,
    remove_unfinished,
    resolve_target,
)
from demoforge.storage.lerobot.version_builder import PathBuilder, VersionBuilder, VersionMetadata, end_version
from demoforge.storage.scheduling import normal_priority
from demoforge.storage.video import decode_indices
from demoforge.storage.write_errors import StorageWriteError


class RepairError(ValueError):
    """The dataset cannot be repaired as asked (not a LeRobot v3.0 dataset, an unreadable file repair needs,
    a target that exists); nothing was written."""


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode found on disk: kept (``recovered``) or dropped, and why."""

    episode_index: int
    frames: int | None  # None: an episode info.json counts whose rows are gone (its length is not known)
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


def _whole_frames(path: Path) -> tuple[int, bool]:
    """Frames of the first video stream that are whole, counted from its packets (no decoding) when every packet
    is; in a file cut short (a packet FFmpeg flags corrupt, or one past the end), the frames that decode before
    the cut, in presentation order: a frame that waits for a later packet (B-frames) is not whole."""
    from demoforge.storage.video import open_video

    size = path.stat().st_size
    frames = 0
    with open_video(path) as container:
        for packet in container.demux(container.streams.video[0]):
            if not packet.size:
                continue
            if packet.is_corrupt or (packet.pos is not None and packet.pos + packet.size > size):
                break
            frames += 1
        else:
            return frames, False
    return _frames_before_the_cut(path, size), True


def _frames_before_the_cut(path: Path, size: int) -> int:
    import av

    from demoforge.storage.video import open_video

    frames = 0
    with open_video(path) as container:
        stream = container.streams.video[0]
        try:
            for packet in container.demux(stream):
                if not packet.size:
                    continue
                if packet.is_corrupt or (packet.pos is not None and packet.pos + packet.size > size):
                    break
                frames += len(stream.codec_context.decode(packet))
        except av.error.FFmpegError:
            pass
    return frames


def _frame_counts(root: Path, key: str, findings: list[str]) -> list[tuple[tuple[int, int], int]]:
    """((chunk, file), frames it holds) of each of a camera's files, in order."""
    import av

    out = []
    for path in sorted((root / "videos" / key).glob("chunk-*/file-*.mp4")):
        try:
            frames, cut = _whole_frames(path)
        except (av.error.FFmpegError, IndexError, OSError) as exc:
            findings.append(f"{path.relative_to(root)}: unreadable ({exc}); the episodes in it are lost")
            frames = 0
        else:
            if cut:
                findings.append(f"{path.relative_to(root)}: cut short; {frames} whole frame(s) before the cut")
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
            findings.append(f"videos/{key}: no video file (LeRobot's batch encoding had not run): an episode's "
                            f"frames are only where LeRobot keeps them before encoding, images/{key}/")
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
                    "them" if whole else f" and {len(pngs)} are PNGs (its video file ends before its frames: the "
                    "recording stopped before they were written, or the file was cut short)")


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

    import av

    chunk, file, begin, _ = where
    path = root / info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
    first = round(begin * info["fps"])
    try:
        frames = decode_indices(path, [first + i for i in sorted(set(sample_indices(length)))])
    except av.error.FFmpegError as exc:
        raise RepairError(f"{path.name} of {key}: its frames do not decode ({exc}); nothing was written") from None
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


@contextlib.contextmanager
def _quiet_ffmpeg() -> Iterator[None]:
    """FFmpeg's notes while LeRobot's helpers encode and join files ("Starting second pass: moving the moov
    atom ...") are not ours to print; its errors still are."""
    import av.logging

    av.logging.set_libav_level(av.logging.ERROR)
    try:
        yield
    finally:
        av.logging.set_libav_level(av.logging.INFO)  # FFmpeg's default


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
            with normal_priority(), _quiet_ffmpeg():  # SVT-AV1 as root asks for SCHED_FIFO 99
                encode_video_frames(episode.pngs[key], part, fps, RGBEncoderConfig(vcodec=codec))
            parts.append(part)
            length = episode.rows.num_rows
            episode.videos[key] = (chunk, file, begin / fps, (begin + length) / fps)
            begin += length
        joined = scratch / f"{key}.mp4"
        with _quiet_ffmpeg():
            concatenate_video_files(parts, joined)
        out[Path(info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file))] = joined
        if not features[key].get("info"):
            features[key] = {**features[key], "info": get_video_info(joined)}
    return out


@dataclass(frozen=True)
class _Ours:
    """What demoforge's export added to the dataset being repaired: its marker and its episode records."""

    marker: ExportMarker
    records: dict[int, dict[str, Any]]  # dataset_episode_index -> its sidecar row


def _read_ours(root: Path, findings: list[str]) -> _Ours | None:
    """demoforge's files of ``root``, when demoforge exported it (None: a dataset LeRobot's writer made)."""
    if not (root / MARKER).is_file():
        return None
    try:
        marker = ExportMarker.read(root)
    except (OSError, ValueError, MarkerError) as exc:
        raise RepairError(f"{root / MARKER} cannot be read ({exc}): it is how demoforge knows which store episode "
                          "each dataset episode is; re-export the dataset from its store instead") from None
    try:
        records = {int(r["dataset_episode_index"]): r for r in read_sidecar(root)}
    except FileNotFoundError:
        records = {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        findings.append(f"{SIDECAR}: unreadable ({exc}); the repaired dataset has no segment records")
        records = {}
    return _Ours(marker, records)


def _copy_rows_and_videos(root: Path, build: Path, info: dict[str, Any], kept: list[_Episode],
                          encoded: dict[Path, Path]) -> None:
    """The kept episodes' rows (renumbered after lost ones) into their data files, and the video files they use
    (copied, or the new files --encode-pngs made)."""
    from lerobot.datasets.io_utils import write_table_one_row_group_per_episode

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
        episode.rows = rows  # its statistics are of the renumbered rows
        by_file.setdefault(episode.data_file, []).append(rows)
        start += rows.num_rows
    for (chunk, file), parts in by_file.items():
        path = build / info["data_path"].format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table_one_row_group_per_episode(pa.concat_tables(parts), path)
    for relative, path in encoded.items():
        (build / relative).parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, build / relative)
    copied: set[Path] = set(encoded)
    for episode in kept:
        for key, (chunk, file, _, _) in episode.videos.items():
            relative = Path(info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file))
            if relative not in copied:
                (build / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(root / relative, build / relative)  # its bytes, not a read-only source's mode
                copied.add(relative)


def _kept_stats(build: Path, info: dict[str, Any], features: dict[str, dict], episode: _Episode
                ) -> dict[str, dict[str, np.ndarray]]:
    """An episode's statistics: those its surviving metadata row had (the renumbered columns' recomputed), else
    LeRobot's, computed from its rows and the copied frames."""
    from lerobot.datasets.compute_stats import compute_episode_stats

    stats = _stats_from_meta(episode.meta) if episode.meta is not None else {}
    if set(stats) != {k for k, ft in features.items() if ft["dtype"] not in ("string", "language")}:
        return _episode_stats(build, info, features, episode)
    renumbered = {k: np.asarray(episode.rows.column(k).to_numpy(zero_copy_only=False)).reshape(-1)
                  for k in ("episode_index", "index") if k in features}
    return {**stats, **compute_episode_stats(renumbered, {k: features[k] for k in renumbered})}


def _task_names(tasks: Any, episode: _Episode) -> list[str]:
    task_ids = sorted(set(np.asarray(episode.rows.column("task_index").to_numpy(zero_copy_only=False))
                          .reshape(-1).tolist()))
    return [str(tasks.index[tasks["task_index"] == t][0]) for t in task_ids]


def _create_lerobot_metadata(root: Path, build: Path, info: dict[str, Any], features: dict[str, dict]) -> Any:
    """LeRobot's own metadata writer for the repaired dataset (it creates ``build`` and writes info.json)."""
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    return LeRobotDatasetMetadata.create(
        repo_id=f"repaired/{root.name}", fps=int(info["fps"]), features=features, robot_type=info.get("robot_type"),
        root=build, use_videos=any(ft["dtype"] == "video" for ft in features.values()),
        chunks_size=info.get("chunks_size"), data_files_size_in_mb=info.get("data_files_size_in_mb"),
        video_files_size_in_mb=info.get("video_files_size_in_mb"))


def _lerobot_metadata(meta: Any, build: Path, info: dict[str, Any], features: dict[str, dict],
                      kept: list[_Episode], tasks: Any, progress: Callable[[int, int], None]) -> None:
    """Episodes, info, statistics and tasks by LeRobot's own metadata writer (a dataset LeRobot's writer made)."""
    from lerobot.datasets.io_utils import write_tasks

    meta.tasks = tasks
    write_tasks(tasks, build)
    start = 0
    for new_index, episode in enumerate(kept):
        length = episode.rows.num_rows
        chunk, file = episode.data_file
        metadata: dict[str, Any] = {"data/chunk_index": chunk, "data/file_index": file,
                                    "dataset_from_index": start, "dataset_to_index": start + length}
        for key, (v_chunk, v_file, begin, end) in episode.videos.items():
            metadata.update({f"videos/{key}/chunk_index": v_chunk, f"videos/{key}/file_index": v_file,
                             f"videos/{key}/from_timestamp": begin, f"videos/{key}/to_timestamp": end})
        meta.save_episode(new_index, length, _task_names(tasks, episode), _kept_stats(build, info, features, episode),
                          metadata)
        start += length
        progress(new_index + 1, len(kept))
    meta.finalize()


def _next_cursor(build: Path, pattern: str) -> tuple[int, int]:
    files = sorted(build.glob(pattern))
    return next_file(*_chunk_file(files[-1])) if files else (0, 0)


def _demoforge_metadata(build: Path, info: dict[str, Any], features: dict[str, dict], kept: list[_Episode],
                        tasks: Any, ours: _Ours, number: int, lost: list[int], progress: Callable[[int, int], None]
                        ) -> VersionMetadata:
    """The episode rows by the export's own writer, and what the small files and the marker say (the version
    builder writes them: a dataset demoforge exported must stay what a later export appends to)."""
    from demoforge.storage.lerobot.files import EpisodeMetaRow, write_episode_meta
    from demoforge.storage.lerobot.subtasks import subtask_columns

    fps = int(info["fps"])
    records = [ours.records.get(e.index) for e in kept]
    segmented = all(r is not None for r in records)
    rows: list[EpisodeMetaRow] = []
    start = 0
    for new_index, (episode, record) in enumerate(zip(kept, records)):
        length = episode.rows.num_rows
        rows.append(EpisodeMetaRow(
            episode_index=new_index, task=_task_names(tasks, episode)[0], length=length, dataset_from_index=start,
            dataset_to_index=start + length, data_file=episode.data_file, videos=dict(episode.videos),
            stats=_kept_stats(build, info, features, episode),
            subtasks=subtask_columns(record.get("segments", []), fps) if segmented and record is not None else {}))
        start += length
        progress(new_index + 1, len(kept))
    meta_next, _files = write_episode_meta(build, rows, (0, 0))
    names = {str(name): int(index) for name, index in zip(tasks.index, tasks["task_index"])}
    old = ours.marker
    published = {e.dataset_index: e for e in old.episodes}
    episodes = tuple(PublishedEpisode(published[e.index].episode_id, new, published[e.index].store_id)
                     for new, e in enumerate(kept) if e.index in published)
    marker = ExportMarker(
        version=number, repo_id=old.repo_id, schema=old.schema, total_episodes=len(kept), total_frames=start,
        tasks=names, next_data=_next_cursor(build, "data/chunk-*/file-*.parquet"), next_meta=meta_next,
        next_videos={name: _next_cursor(build, f"videos/{camera_key(name)}/chunk-*/file-*.mp4")
                     for name in old.next_videos},
        episodes=episodes, removed=old.removed,
        edit={"operation": "repair", "from": {"version": old.version}, "lost": lost})
    sidecar = [{**r, "dataset_episode_index": i} for i, r in enumerate(records) if r is not None] if segmented else []
    return VersionMetadata(
        tasks=names, episode_stats=[r.stats for r in rows], marker=marker, sidecar=sidecar,
        info={**info, "total_episodes": len(kept), "total_frames": start, "total_tasks": len(names),
              "splits": {"train": f"0:{len(kept)}"}})


@dataclass(frozen=True)
class _Rebuild:
    """What repair writes, wherever it goes (a new dataset version, or a folder): the kept episodes' rows and
    videos, then their metadata by LeRobot's writer (a dataset it made) or the export's (one demoforge made)."""

    root: Path
    info: dict[str, Any]
    features: dict[str, dict]
    kept: list[_Episode]
    tasks: Any
    progress: Callable[[int, int], None]
    encode_codec: str | None
    ours: _Ours | None
    lost: list[int]

    def into(self, build: Path, number: int) -> VersionMetadata | None:
        """Write into ``build`` (created here when missing). A demoforge dataset's small files and marker are left
        to write: returned as what they say (``number``: the version's)."""
        root, info, features, kept = self.root, self.info, self.features, self.kept
        scratch = build.with_name(build.name + "-videos")
        try:
            encoded = _encode_pngs(root, scratch, info, features, kept, self.encode_codec)
            meta = _create_lerobot_metadata(root, build, info, features) if self.ours is None else None
            if meta is None:
                build.mkdir(parents=True, exist_ok=True)
            _copy_rows_and_videos(root, build, info, kept, encoded)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if meta is not None:
            _lerobot_metadata(meta, build, info, features, kept, self.tasks, self.progress)
            return None
        assert self.ours is not None
        return _demoforge_metadata(build, info, features, kept, self.tasks, self.ours, number, self.lost,
                                   self.progress)


def _lost_episodes(info: dict[str, Any], meta_rows: dict[int, dict[str, Any]], episodes: list[_Episode]
                   ) -> list[EpisodeOutcome]:
    """The episodes info.json (or the surviving episode metadata) counts whose rows are not in the data files
    at all: cut off with the end of a data file, or in one that does not read."""
    found = {e.index for e in episodes}
    counted = info.get("total_episodes")
    expected = set(range(counted)) if isinstance(counted, int) and 0 <= counted <= 10**7 else set()
    missing = sorted((expected | set(meta_rows)) - found)
    return [EpisodeOutcome(i, int(meta_rows[i]["length"]) if i in meta_rows else None, False,
                           "info.json counts it, but none of its rows is in the data files (cut off, or in a data "
                           "file that does not read)") for i in missing]


def _image_findings(root: Path, episodes: list[_Episode]) -> list[str]:
    """What ``images/`` (where LeRobot keeps frames before it encodes them) and ``tmp*/`` hold, said as it is:
    the only copy of saved episodes' frames, or the frames of the episode the recording stopped in."""
    folders: dict[int, int] = {}
    for folder in root.glob("images/*/episode-*"):
        with contextlib.suppress(ValueError, OSError):
            if folder.is_dir() and any(folder.iterdir()):
                index = int(folder.name.split("-", 1)[1])
                folders[index] = folders.get(index, 0) + 1
    saved = {e.index: e for e in episodes}
    only = sorted(i for i in folders if i in saved and saved[i].pngs)
    dropped = sorted(i for i in folders if i in saved and not saved[i].pngs and "PNG" in (saved[i].problem or ""))
    redundant = sorted(i for i in folders if i in saved and i not in only and i not in dropped)
    unsaved = sorted(i for i in folders if i not in saved)
    out = []
    if only:
        out.append(f"images/ holds the only copy of the frames of saved episode(s) {_listed(only)}: --encode-pngs "
                   "encodes them into the repaired dataset (the PNGs stay where they are)")
    if dropped:
        out.append(f"images/ holds the only copy of the frames of saved episode(s) {_listed(dropped)}: "
                   "--encode-pngs encodes them; without it they are not in the repaired dataset")
    if redundant:
        out.append(f"images/ also holds PNG frames of episode(s) {_listed(redundant)}, whose frames the video files "
                   "have")
    if unsaved:
        out.append(f"images/ holds PNG frames of episode(s) {_listed(unsaved)}, which no data file has (the "
                   "episode the recording stopped in): not part of the repaired dataset")
    temporary = sorted(p.name for p in root.glob("tmp*") if p.is_dir())
    if temporary:
        out.append(f"{', '.join(temporary)}: the streaming encoder's file of the episode the recording stopped in: "
                   "not part of any saved episode")
    return out


def _listed(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices[:20]) + (f" and {len(indices) - 20} more" if len(indices) > 20 else "")


#: What LeRobot's encoder is called for the codec a stream records (info.json's ``video.codec``).
_ENCODER_OF_STREAM = {"av1": "libsvtav1"}


def _check_vcodec(vcodec: str | None, encode_pngs: bool) -> None:
    """``--vcodec``: a codec LeRobot's encoder takes and this PyAV can encode, checked before anything is read."""
    if vcodec is None:
        return
    if not encode_pngs:
        raise RepairError(f"--vcodec {vcodec!r} is the codec --encode-pngs encodes with; give --encode-pngs too")
    import av
    from lerobot.configs.video import RGBEncoderConfig

    try:
        RGBEncoderConfig(vcodec=vcodec)
    except ValueError as exc:
        raise RepairError(f"--vcodec: {exc}") from None
    if vcodec == "auto":
        return
    try:
        av.codec.Codec(vcodec, "w")
        if vcodec.endswith(_HARDWARE):  # built in, but it opens only where its device is
            context: Any = av.CodecContext.create(vcodec, "w")  # a video context (the stubs type the base)
            context.width, context.height, context.pix_fmt = 64, 64, "yuv420p"
            context.time_base = Fraction(1, 30)
            context.open()
    except (av.error.FFmpegError, ValueError) as exc:
        raise RepairError(f"--vcodec {vcodec!r}: this PyAV/FFmpeg cannot encode with it here ({exc})") from None


_HARDWARE = ("_nvenc", "_qsv", "_vaapi", "_videotoolbox")


def _write_failure(exc: OSError, where: Path) -> StorageWriteError:
    """An OS error while writing the repaired dataset, named (exit status 4 at the command line)."""
    return StorageWriteError("the repaired dataset", Path(exc.filename) if exc.filename else where, exc)


def repair_dataset(dataset: Path | str, out: Path | str | None = None, *, in_place: bool = False,
                   dry_run: bool = False, encode_pngs: bool = False, vcodec: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> RepairReport:
    """Repair ``dataset`` into ``out`` (default ``<dataset>-repaired``), or in place (the broken dataset is kept
    beside it as ``<name>.broken-<time>``). A healthy dataset is left alone and nothing is written.

    ``encode_pngs``: episodes whose frames are whole PNG folders that LeRobot had not encoded yet (streaming
    off, ``batch_encoding_size`` > 1) are encoded with ``vcodec`` (None: the codec info.json records, else
    LeRobot's default); without it they are dropped and named. Raises :class:`RepairError` for input it cannot
    repair as asked (nothing written) and :class:`StorageWriteError` for an OS error while writing."""
    started = time.monotonic()
    root = Path(dataset)
    if in_place and out is not None:
        raise RepairError("--in-place and --out exclude each other")
    _check_vcodec(vcodec, encode_pngs)
    target = root if in_place else Path(out) if out is not None else root.with_name(root.name + "-repaired")
    if not in_place:
        why = output_overlap(target, {"the dataset to repair": root})
        if why is not None:
            raise RepairError(f"--out {why}: repair writes a new dataset beside the broken one, never into it "
                              "(or replaces it: --in-place); nothing was written")
        if target.exists() or target.is_symlink():
            raise RepairError(f"{target} exists; repair writes a new dataset (give another --out, or --in-place)")
    try:
        return _repair(root, target, in_place, dry_run, encode_pngs, vcodec, progress, started)
    except PermissionError as exc:  # reading: writing failures leave _publish as StorageWriteError
        raise RepairError(f"cannot read {exc.filename or root}: {exc.strerror}; nothing was written") from None


def _repair(root: Path, target: Path, in_place: bool, dry_run: bool, encode_pngs: bool, vcodec: str | None,
            progress: Callable[[int, int], None] | None, started: float) -> RepairReport:
    info = _read_info(root)
    from lerobot.datasets.feature_utils import get_hf_features_from_features
    from lerobot.datasets.io_utils import load_tasks

    features = _features(info)
    fps = int(info["fps"])
    schema = get_hf_features_from_features(features).arrow_schema
    findings: list[str] = []
    ours = _read_ours(root, findings)
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
    recorded = {str(codec) for k in video_keys if (codec := (features[k].get("info") or {}).get("video.codec"))}
    default = _ENCODER_OF_STREAM.get(min(recorded), min(recorded)) if len(recorded) == 1 else "libsvtav1"
    encode_codec = (vcodec or default) if encode_pngs else None
    _place_videos(episodes, root, video_keys, fps, findings, encode_codec)
    missing = _lost_episodes(info, meta_rows, episodes)
    if missing:
        findings.append(f"{len(missing)} episode(s) info.json counts have no rows in the data files: "
                        f"{_listed([e.episode_index for e in missing])}")
    healthy = not missing and _is_healthy(tables, meta_rows, info, episodes, findings)
    kept = [e for e in episodes if e.problem is None]
    new_index = {e.index: i for i, e in enumerate(kept)}

    def why_kept(episode: _Episode) -> str:
        if episode.pngs:
            return f"rows whole; frames encoded from its PNGs with {encode_codec}"
        return "rows and video whole" + ("" if episode.meta is not None else "; metadata rebuilt")

    outcomes = tuple(sorted((*(EpisodeOutcome(e.index, e.rows.num_rows, e.problem is None, e.problem or why_kept(e),
                                              new_index.get(e.index)) for e in episodes), *missing),
                            key=lambda o: o.episode_index))
    findings += _image_findings(root, episodes)
    if healthy or dry_run or not kept:
        return RepairReport(root, None, healthy, outcomes, tuple(findings), elapsed_s=time.monotonic() - started)
    lost = [o.episode_index for o in outcomes if not o.recovered]
    backup = _publish(root, target, in_place, _Rebuild(root, info, features, kept, tasks,
                                                      progress or (lambda done, total: None), encode_codec, ours,
                                                      lost))
    return RepairReport(root, target, False, outcomes, tuple(findings), backup, time.monotonic() - started)


def _publish(root: Path, target: Path, in_place: bool, rebuild: _Rebuild) -> Path | None:
    """Build the repaired dataset and put it in place; returns where the broken one was kept (--in-place).

    A demoforge dataset is published as a dataset version (in place: the next version of the dataset's link,
    the broken version moved out as ``NAME.broken-TIME``; new: the first version of a new link). Any other is
    built beside the target and renamed into place."""
    import av

    published: Published | None = None
    if rebuild.ours is not None:
        try:
            published = resolve_target(target)  # in place: the link and its broken version; new: nothing yet
        except ExportError:
            published = None  # a copy of a version folder, not a published link: repaired as a folder
    try:
        if published is not None:
            return _publish_version(root, published, in_place, rebuild)
        return _publish_folder(root, target, in_place, rebuild)
    except av.error.FFmpegError as exc:  # an OSError too: the encoder of --encode-pngs, or a file it reads
        raise RepairError(f"FFmpeg failed while the repaired dataset was built: {exc}; nothing was written") from None
    except PermissionError as exc:
        if exc.filename and Path(os.path.realpath(exc.filename)).is_relative_to(os.path.realpath(root)):
            raise RepairError(f"cannot read {exc.filename}: {exc.strerror}; nothing was written") from None
        raise _write_failure(exc, target.parent) from exc
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPERM):
            raise _write_failure(exc, target.parent) from exc
        raise


def _backup_name(root: Path) -> Path:
    return root.with_name(f"{root.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")


def _publish_folder(root: Path, target: Path, in_place: bool, rebuild: _Rebuild) -> Path | None:
    """A dataset built beside the target and renamed into place (in place: the broken one moved aside first)."""
    build = target.with_name(f".{target.name}.repair-{os.getpid()}")
    if build.exists():
        shutil.rmtree(build)
    backup: Path | None = None

    def move_broken_aside() -> None:
        nonlocal backup
        backup = _backup_name(root)
        os.rename(root, backup)

    with PathBuilder(target, build) as built:
        metadata = rebuild.into(build, 1)
        if metadata is not None:  # a copy of a demoforge version folder: its small files and marker too
            end_version(build, metadata)
        built.publish(move_broken_aside if in_place else None)
    return backup


def _publish_version(root: Path, target: Published, in_place: bool, rebuild: _Rebuild) -> Path | None:
    """The repaired dataset as the next version of the dataset's link (the broken version moved out)."""
    fd = lock_exports(target.versions)  # no export or edit publishes meanwhile
    try:
        remove_unfinished(target.versions, target.current)
        number = max([int(v.name[1:]) for v in finished_versions(target.versions)] + [0]) + 1
        with VersionBuilder(target, number, name_write_errors=False) as version:
            metadata = rebuild.into(version.path, number)
            assert metadata is not None  # only a dataset demoforge exported is published as a version
            version.wrote(*(p for p in version.path.rglob("*") if p.is_file()))
            version.publish(metadata)
        if not in_place or target.current is None:
            return None
        backup = _backup_name(root)
        try:
            os.rename(target.current, backup)  # the broken version, out of the versions a later export prunes
        except OSError:  # published already: the broken version stays among the dataset's versions
            return target.current
        fsync_dir(target.versions)
        return backup
    finally:
        os.close(fd)
