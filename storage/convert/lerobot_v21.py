"""LeRobot v2.1: one parquet and one mp4 per episode, what NVIDIA GR00T N1.5 and older openpi read.

The layout is what LeRobot 0.6.1's own ``lerobot/scripts/convert_dataset_v21_to_v30.py`` reads (the spec of
v2.1 we test against: it converts our output back, and the result is compared with the v3.0 dataset):

- ``data/chunk-XXX/episode_XXXXXX.parquet``: an episode's rows, every column of the v3.0 data but LeRobot 0.6's
  two language columns (v2.1 has no ``language`` dtype, so a v2.1 reader would refuse the features; the
  segments stay in the ``annotation.*`` columns and the sidecar);
- ``videos/chunk-XXX/<key>/episode_XXXXXX.mp4``: an episode's frames of one camera, its packets copied out of
  the v3.0 file (``storage/lerobot/video_cut.py``: an episode that does not start on a keyframe has its frames
  up to the first keyframe re-encoded, a *smart cut*; the count is reported), timestamps from 0;
- ``meta/info.json`` (``codebase_version`` ``v2.1``, ``total_chunks``, ``total_videos``, the per-episode path
  templates), ``meta/episodes.jsonl`` (index, tasks, length, and the SARM sub-task columns when the dataset has
  them: LeRobot's converter carries every key of a line into ``meta/episodes``), ``meta/tasks.jsonl``,
  ``meta/episodes_stats.jsonl`` (each episode's statistics as its ``meta/episodes`` row holds them) and
  ``meta/stats.json`` (their aggregate, as LeRobot aggregates);
- demoforge's own files, as the export writes them: the sidecar ``meta/demoforge_episodes.jsonl`` (segments,
  success, seeds), the SARM proportion files, ``meta/modality.json`` (GR00T's map of the state, action and
  camera columns) and ``meta/demoforge_convert.json`` (what was converted from where).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.convert.reading import reading
from demoforge.storage.convert.report import ConvertError, ConvertReport
from demoforge.storage.faults import ExportStep, reach
from demoforge.storage.lerobot.edit_source import DatasetToEdit
from demoforge.storage.lerobot.format import INFO, SIDECAR, STATS
from demoforge.storage.lerobot.stats_file import aggregate_stats, stats_json_text
from demoforge.storage.lerobot.subtasks import COLUMNS as SUBTASK_COLUMNS
from demoforge.storage.lerobot.subtasks import PROPORTIONS_PATH, MODES
from demoforge.storage.lerobot.video_cut import Span, SpanCut, copy_episodes

FORMAT = "lerobot-v2.1"
CODEBASE_VERSION = "v2.1"
CHUNKS_SIZE = 1000  # lerobot's DEFAULT_CHUNK_SIZE: episodes per chunk folder
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
EPISODES = "meta/episodes.jsonl"  # lerobot.datasets.utils.LEGACY_EPISODES_PATH
EPISODES_STATS = "meta/episodes_stats.jsonl"  # LEGACY_EPISODES_STATS_PATH
TASKS = "meta/tasks.jsonl"  # LEGACY_TASKS_PATH
MODALITY = "meta/modality.json"
PROVENANCE = "meta/demoforge_convert.json"
#: demoforge files carried over as they are (when the dataset has them).
CARRIED = (SIDECAR, *(PROPORTIONS_PATH.format(mode=mode) for mode in MODES))


def write(dataset: Path, out: Path) -> ConvertReport:
    """Write the v3.0 dataset at ``dataset`` as LeRobot v2.1 into the new folder ``out``."""
    with reading(dataset) as source:
        return _Writer(source, out).write()


class _Writer:
    def __init__(self, source: DatasetToEdit, out: Path) -> None:
        self.source, self.out = source, out
        self.language = [k for k, ft in source.features.items() if ft.get("dtype") == "language"]
        for key in source.video_keys:
            if "/" in key or key in (".", "..") or "\x00" in key:
                raise ConvertError(f"{source.path}: the video key {key!r} (from {INFO}) cannot name a folder; "
                                   "nothing was written")

    def write(self) -> ConvertReport:
        source = self.source
        self.out.mkdir()
        cuts = self._videos()
        reach(ExportStep.AFTER_VIDEOS)
        self._data()
        reach(ExportStep.AFTER_DATA)
        stats = [self._episode_stats(e.index) for e in source.episodes]
        _jsonl(self.out / EPISODES, [self._episode_row(e.index) for e in source.episodes])
        _jsonl(self.out / EPISODES_STATS, [{"episode_index": i, "stats": _plain(s)} for i, s in enumerate(stats)])
        _jsonl(self.out / TASKS, [{"task_index": i, "task": task} for i, task in enumerate(source.tasks)])
        (self.out / STATS).write_text(stats_json_text(aggregate_stats(stats)))
        _json(self.out / INFO, self._info())
        for relative in CARRIED:
            if (source.root / relative).is_file():
                shutil.copyfile(source.root / relative, self.out / relative)
        modality = self._modality()
        if modality is not None:
            _json(self.out / MODALITY, modality)
        _json(self.out / PROVENANCE, {"writer": "demoforge", "format": FORMAT, "source": {
            "path": str(source.path), "version": source.version, "codebase_version": source.info["codebase_version"],
            "digest": source.digest()}})
        return ConvertReport(FORMAT, len(source.episodes), sum(e.length for e in source.episodes),
                             notes=tuple(self._notes(cuts)))

    # -- video: each episode's packets copied out of its v3.0 file
    def _videos(self) -> list[SpanCut]:
        source = self.source
        cuts: list[SpanCut] = []
        for key in source.video_keys:
            by_file: dict[Path, list[tuple[Span, Path]]] = {}
            for e in source.episodes:
                path, start, end = source.video_file(key, e.index)
                target = self.out / VIDEO_PATH.format(episode_chunk=e.index // CHUNKS_SIZE, video_key=key,
                                                      episode_index=e.index)
                by_file.setdefault(path, []).append((Span(f"episode {e.index}", start, end, e.length), target))
            for path, members in by_file.items():
                members.sort(key=lambda m: m[0].from_s)
                video = source.video(path)
                try:
                    results = copy_episodes(video, [m[0] for m in members], [m[1] for m in members],
                                            source.features[key].get("info"))
                finally:
                    video.held = None  # copied packets were re-timed in place: never copy them twice
                cuts += [c for r in results for c in r.cuts]
        return cuts

    # -- data: each episode's rows, the language columns left out
    def _data(self) -> None:
        import pyarrow.parquet as pq

        for e in self.source.episodes:
            table, start = self.source.data_rows(e.index)
            part = table.slice(start, e.length).drop_columns([c for c in self.language if c in table.column_names])
            part = part.replace_schema_metadata(_hf_metadata(part.schema.metadata, self.language))
            path = self.out / DATA_PATH.format(episode_chunk=e.index // CHUNKS_SIZE, episode_index=e.index)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, path)

    # -- metadata
    def _episode_stats(self, index: int) -> dict[str, dict[str, np.ndarray]]:
        stats = self.source.episode_stats(index)
        return {k: v for k, v in stats.items() if k not in self.language}

    def _episode_row(self, index: int) -> dict[str, Any]:
        e = self.source.episodes[index]
        row: dict[str, Any] = {"episode_index": index, "tasks": list(e.tasks), "length": e.length}
        meta = self.source.row(index)
        for column in SUBTASK_COLUMNS:  # SARM's sub-tasks: the converter carries them into meta/episodes
            if meta.get(column) is not None:
                row[column] = list(meta[column])
        return row

    def _info(self) -> dict[str, Any]:
        source = self.source
        count = len(source.episodes)
        features: dict[str, Any] = {}
        for key, ft in source.features.items():
            if key in self.language:
                continue
            ft = dict(ft)
            if ft.get("dtype") == "video":  # v2.1 named the depth flag video.is_depth_map
                info = dict(ft.get("info") or {})
                info["video.is_depth_map"] = bool(info.get("is_depth_map", False))
                ft["info"] = info
            features[key] = ft
        return {"codebase_version": CODEBASE_VERSION, "robot_type": source.info.get("robot_type"),
                "total_episodes": count, "total_frames": sum(e.length for e in source.episodes),
                "total_tasks": len(source.tasks), "total_videos": count * len(source.video_keys),
                "total_chunks": math.ceil(count / CHUNKS_SIZE), "chunks_size": CHUNKS_SIZE, "fps": source.fps,
                "splits": {"train": f"0:{count}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if source.video_keys else None, "features": features}

    def _modality(self) -> dict[str, Any] | None:
        """GR00T's ``meta/modality.json``: the state vectors, the action and the cameras by name, the task as its
        language annotation. None when the dataset has no ``observation.state`` / ``action`` vector."""
        features = self.source.features
        state, action = features.get("observation.state"), features.get("action")
        if state is None or action is None or len(state["shape"]) != 1 or len(action["shape"]) != 1:
            return None
        states: dict[str, dict[str, Any]] = {"state": {"start": 0, "end": int(state["shape"][0])}}
        for key, ft in features.items():  # other state vectors (observation.goal, ...) by their own column
            if key.startswith("observation.") and key != "observation.state" and ft.get("dtype") == "float32" \
                    and len(ft.get("shape") or ()) == 1 and ft["shape"][0] > 1:
                states[key.removeprefix("observation.")] = {"start": 0, "end": int(ft["shape"][0]), "original_key": key}
        videos = {key.removeprefix("observation.images.").removeprefix("observation."): {"original_key": key}
                  for key in self.source.video_keys}
        return {"state": states, "action": {"action": {"start": 0, "end": int(action["shape"][0])}},
                "video": videos, "annotation": {"human.task_description": {"original_key": "task_index"}}}

    def _notes(self, cuts: Sequence[SpanCut]) -> list[str]:
        notes = []
        reencoded = sum(c.reencoded for c in cuts)
        if reencoded:
            notes.append(f"smart cut: {reencoded} frame(s) of {sum(1 for c in cuts if c.reencoded)} episode video(s) "
                         "re-encoded (they did not start on a keyframe); every other frame's packet was copied")
        elif cuts:
            notes.append(f"video: {len(cuts)} episode file(s), every packet copied (nothing re-encoded)")
        if self.language:
            notes.append(f"left out {', '.join(self.language)}: LeRobot 0.6's language columns, which v2.1 has no "
                         "dtype for (the segments are in the annotation.* columns and meta/demoforge_episodes.jsonl)")
        return notes


def _hf_metadata(metadata: Mapping[bytes, bytes] | None, dropped: Sequence[str]) -> dict[bytes, bytes]:
    """The parquet's schema metadata without the dropped columns in its ``huggingface`` features."""
    out = dict(metadata or {})
    raw = out.get(b"huggingface")
    if raw is not None and dropped:
        hf = json.loads(raw)
        features = (hf.get("info") or {}).get("features")
        if isinstance(features, dict):
            for key in dropped:
                features.pop(key, None)
        out[b"huggingface"] = json.dumps(hf).encode()
    return out


def _plain(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    return {feature: {name: np.asarray(value).tolist() for name, value in per.items()}
            for feature, per in stats.items()}


def _json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False) + "\n")


def _jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
