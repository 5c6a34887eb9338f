"""A published LeRobot v3.0 dataset, read for ``demoforge edit`` / ``merge``: its episodes, where each one's
frames, video spans and statistics are, its tasks, and (for a dataset demoforge wrote) the marker and sidecar.

A demoforge dataset is read at its published version (``OUT`` -> ``OUT.versions/vNNNNNN``, resolved once); a
LeRobot dataset demoforge did not write (*foreign*) is read where it is and is never modified. Paths named by
a dataset's own metadata are refused when they would lead outside it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.lerobot.format import INFO, MARKER, SIDECAR, TASKS, ExportMarker, MarkerError, read_sidecar
from demoforge.storage.lerobot.publish import VERSIONS_SUFFIX, ExportError, Published, resolve_target
from demoforge.storage.paths import short_path

EPISODES_GLOB = "meta/episodes/*/*.parquet"
VIDEO_CACHE = 4  # demuxed video files kept for the next part of a split


class EditError(ExportError):
    """The edit cannot be made as asked (bad input, a dataset that cannot be read); nothing was written."""


@dataclass(frozen=True)
class SourceEpisode:
    """One episode of a dataset being edited."""

    index: int
    length: int
    tasks: tuple[str, ...]  # LeRobot's tasks of the episode (meta/episodes "tasks")
    record: Mapping[str, Any] | None  # the demoforge sidecar row; None for a foreign dataset
    store_id: str | None  # where it came from (demoforge datasets; None in markers before store ids)
    episode_id: str | None  # the staging episode (demoforge datasets)

    @property
    def task(self) -> str:
        return self.tasks[0] if self.tasks else ""

    @property
    def identity(self) -> str:
        """A name that stays with the episode across edits (its store and staging episode), or its index."""
        if self.episode_id is not None:
            return f"{self.store_id or '-'}:{self.episode_id}"
        return f"#{self.index}"


class DatasetToEdit:
    """Everything an edit reads from one dataset, opened once."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.published: Published | None = None
        self.marker: ExportMarker | None = None
        if re.fullmatch(r"v[0-9]{6}", self.path.name) and self.path.parent.name.endswith(VERSIONS_SUFFIX):
            link = self.path.parent.name.removesuffix(VERSIONS_SUFFIX)
            raise EditError(f"{short_path(self.path)} is one version of the dataset {link}; name the dataset "
                            f"({self.path.parent.parent / link}) instead")
        if not self.path.exists():
            raise EditError(f"{short_path(self.path)} does not exist")
        if (self.path / MARKER).is_file() or self.path.is_symlink():
            self.published = resolve_target(self.path)  # NotOurDatasetError for a link elsewhere, a bad marker
            if self.published.current is None or self.published.marker is None:
                raise EditError(f"{short_path(self.path)} holds no published dataset version")
            self.root, self.marker = self.published.current, self.published.marker
        elif (self.path / INFO).is_file():
            self.root = self.path.resolve()
        else:
            raise EditError(f"{short_path(self.path)} is not a LeRobot dataset (no {INFO})")
        try:
            self._load()
        except (OSError, ValueError, KeyError, TypeError) as exc:  # pyarrow's errors are ValueErrors / OSErrors
            if isinstance(exc, EditError):
                raise
            raise EditError(f"{short_path(self.path)} cannot be read as a LeRobot v3.0 dataset: "
                            f"{type(exc).__name__}: {exc}") from None

    @property
    def foreign(self) -> bool:
        """True for a LeRobot dataset demoforge did not write."""
        return self.marker is None

    @property
    def version(self) -> str | None:
        return self.root.name if self.published is not None else None

    def _load(self) -> None:
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._real_root = self.root.resolve()
        self._inside: dict[str, Path] = {}
        self._stats_columns: list[tuple[str, str, Any]] | None = None
        self._data: tuple[Path, Any, dict[int, tuple[int, int]]] | None = None
        self._videos: dict[Path, Any] = {}  # path -> VideoFile, least recently used first
        self.info: dict[str, Any] = json.loads((self.root / INFO).read_text())
        if self.info.get("codebase_version") != "v3.0":
            raise EditError(f"{short_path(self.path)} is LeRobot format {self.info.get('codebase_version')!r}; "
                            "demoforge edits v3.0 datasets")
        self.fps = int(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = dict(self.info["features"])
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        tasks = pd.read_parquet(self.root / TASKS)
        by_index = {int(i): str(name) for name, i in zip(tasks.index, tasks["task_index"])}
        if sorted(by_index) != list(range(len(by_index))):
            raise EditError(f"{short_path(self.path)}: {TASKS} task indices are not 0..{len(by_index) - 1}")
        self.tasks = [by_index[i] for i in range(len(by_index))]
        files = sorted(self.root.glob(EPISODES_GLOB))
        if not files:
            raise EditError(f"{short_path(self.path)} has no meta/episodes/*/*.parquet")
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
        order = np.argsort(np.asarray(table["episode_index"].to_numpy()), kind="stable")
        self.episodes_table = table.take(order)
        rows = self.episodes_table.select([c for c in self.episodes_table.column_names
                                           if not c.startswith("stats/")]).to_pylist()
        indices = [int(r["episode_index"]) for r in rows]
        if indices != list(range(len(rows))):
            raise EditError(f"{short_path(self.path)}: its episode indices are not contiguous from 0 "
                            "(`demoforge validate` reports more)")
        self._rows = rows
        records = {int(r["dataset_episode_index"]): r for r in read_sidecar(self.root)} \
            if (self.root / SIDECAR).is_file() else {}
        owners = {e.dataset_index: e for e in self.marker.episodes} if self.marker else {}
        self.has_sidecar = bool(records) or (self.root / SIDECAR).is_file()
        if self.has_sidecar and sorted(records) != indices:
            raise EditError(f"{short_path(self.path)}: {SIDECAR} lists {len(records)} episodes, the dataset holds "
                            f"{len(rows)} (`demoforge validate` reports more)")
        self.episodes = [SourceEpisode(
            index=i, length=int(r["length"]), tasks=tuple(str(t) for t in (r.get("tasks") or ())),
            record=records.get(i), store_id=owners[i].store_id if i in owners else None,
            episode_id=owners[i].episode_id if i in owners else None) for i, r in enumerate(rows)]

    # ------------------------------------------------------------------------------------------ where
    def inside(self, relative: str) -> Path:
        """A path the dataset's own metadata names, refused when it would lead outside the dataset."""
        found = self._inside.get(relative)
        if found is None:
            found = (self.root / relative).resolve()
            if not found.is_relative_to(self._real_root):
                raise EditError(f"{short_path(self.path)}: {relative!r} (from {INFO}) points outside the dataset")
            self._inside[relative] = found
        return found

    def row(self, index: int) -> Mapping[str, Any]:
        return self._rows[index]

    def data_file(self, index: int) -> Path:
        row = self._rows[index]
        return self.inside(self.info["data_path"].format(chunk_index=int(row["data/chunk_index"]),
                                                         file_index=int(row["data/file_index"])))

    def data_rows(self, index: int) -> tuple[Any, int]:
        """The data table holding episode ``index`` and the row its frames start at. The last file read stays
        in memory (the parts of a split read it once)."""
        import pyarrow.parquet as pq

        path = self.data_file(index)
        if self._data is None or self._data[0] != path:
            table = pq.read_table(path)
            values = np.asarray(table["episode_index"].to_numpy())
            bounds: dict[int, tuple[int, int]] = {}
            if len(values):
                edges = np.flatnonzero(np.diff(values)) + 1
                for start, stop in zip(np.r_[0, edges], np.r_[edges, len(values)]):
                    if int(values[start]) in bounds:
                        raise EditError(f"{short_path(path)}: the rows of episode {int(values[start])} are not "
                                        "contiguous")
                    bounds[int(values[start])] = (int(start), int(stop))
            self._data = (path, table, bounds)
        _path, table, bounds = self._data
        start, stop = bounds.get(index, (0, 0))
        length = self.episodes[index].length
        if stop - start != length:
            raise EditError(f"{short_path(path)} holds {stop - start} row(s) of episode {index}; its metadata says "
                            f"{length} (`demoforge validate {self.path}` reports more)")
        return table, start

    def video(self, path: Path) -> Any:
        """The demuxed ``VideoFile`` of one of the dataset's mp4 files, for a copy. The last few stay in memory
        (timestamps and flags only): the parts of a split demux each file once, and all but the first read it
        again only to copy its packets."""
        from demoforge.storage.lerobot.video_cut import VideoFile

        video = self._videos.pop(path, None)
        if video is None:
            video = VideoFile(path, self.fps, hold=True)
        self._videos[path] = video
        while len(self._videos) > VIDEO_CACHE:
            self._videos.pop(next(iter(self._videos)))
        return video

    def video_file(self, key: str, index: int) -> tuple[Path, float, float]:
        """The mp4 holding episode ``index`` of camera ``key`` and the span it is shown in there."""
        row = self._rows[index]
        try:
            relative = self.info["video_path"].format(video_key=key, chunk_index=int(row[f"videos/{key}/chunk_index"]),
                                                      file_index=int(row[f"videos/{key}/file_index"]))
            span = float(row[f"videos/{key}/from_timestamp"]), float(row[f"videos/{key}/to_timestamp"])
        except (KeyError, TypeError) as exc:
            raise EditError(f"{short_path(self.path)}: episode {index} has no video metadata {exc} for {key}") \
                from None
        return self.inside(relative), span[0], span[1]

    def episode_stats(self, index: int) -> dict[str, dict[str, np.ndarray]]:
        """The episode's statistics as its writer stored them (``stats/<feature>/<stat>`` columns), in the
        shapes LeRobot's ``aggregate_stats`` expects (nested lists become arrays: camera stats (C, 1, 1))."""
        if self._stats_columns is None:  # every episode's, converted once (row by row it is 100x slower)
            self._stats_columns = []
            for name in self.episodes_table.column_names:
                feature, _, stat = name.removeprefix("stats/").rpartition("/")
                if name.startswith("stats/") and feature in self.features:
                    self._stats_columns.append((feature, stat, _stacked(self.episodes_table[name])))
        stats: dict[str, dict[str, np.ndarray]] = {}
        for feature, stat, values in self._stats_columns:
            value = values[index]
            if value is not None:
                stats.setdefault(feature, {})[stat] = value
        return stats

    def recorded_checksum(self, relative: str) -> Any:
        """The checksum the version's marker records for a file (None: not recorded, or a foreign dataset)."""
        return self.marker.files.get(relative) if self.marker is not None else None

    def digest(self) -> str:
        """Names this exact content: the marker of a demoforge version, or a foreign dataset's metadata files."""
        digest = hashlib.sha256()
        parts = [self.root / MARKER] if self.marker is not None else \
            [self.root / INFO, *sorted(self.root.glob(EPISODES_GLOB))]
        for path in parts:
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]

    def describe(self) -> str:
        version = f" (version {self.version})" if self.version else " (a LeRobot dataset demoforge did not write)"
        return f"{self.path}{version}"


def _stacked(column: Any) -> Any:
    """A statistics column (nested lists, the same shape in every row) as one array ``(episodes, *shape)``;
    a column with missing values (datasets merged from others) as a list of arrays and Nones."""
    import pyarrow as pa

    values = column.combine_chunks()
    if values.null_count or not len(values):
        return [None if v is None else np.asarray(v) for v in values.to_pylist()]
    shape = np.asarray(values[0].as_py()).shape
    flat = values
    while pa.types.is_list(flat.type) or pa.types.is_large_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
        flat = flat.flatten()
    array = np.asarray(flat.to_numpy(zero_copy_only=False))
    if flat.null_count or array.size != len(values) * int(np.prod(shape, dtype=np.int64)):
        return [None if v is None else np.asarray(v) for v in values.to_pylist()]  # ragged: row by row
    return array.reshape((len(values), *shape))


def open_dataset(path: Path | str) -> DatasetToEdit:
    try:
        return DatasetToEdit(path)
    except MarkerError as exc:
        raise EditError(f"{short_path(path)}: its {MARKER} cannot be read ({exc})") from None
