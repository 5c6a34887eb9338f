"""``demoforge edit`` and ``demoforge merge``: curate published LeRobot v3.0 datasets without re-encoding a frame.

An edit (its rules an :class:`EditRules`, where it goes an :class:`EditOutputs`) chooses episodes
(``storage/lerobot/edit_selection.py``) and writes them as a dataset version through the one version builder
(``storage/lerobot/version_builder.py``): built in ``vNNNNNN.partial`` beside the published version, fsynced,
renamed, and the link swapped with one ``rename(2)``. Readers see the old version or the
new one; a kill at any moment leaves the old one published (the next run clears what it left). In place
(``edit DATASET``) it is the dataset's next version; ``--out``, ``--split`` and ``merge`` write new sibling
datasets, each published the same way.

What a version holds, file by file:

- **video**: per camera, the kept episodes of each source mp4 go to one new mp4, their packets copied
  (``storage/lerobot/video_cut.py``: re-encoding only the frames before the first keyframe of an episode that does not
  start on one, and reporting them). A source file whose episodes are all kept, in order, is hard-linked.
- **data**: the kept episodes' rows, copied with ``episode_index``, ``index`` and ``task_index`` renumbered.
- **meta/episodes**: the kept rows, renumbered, their per-episode statistics kept (those of the renumbered
  columns follow the new values, see ``_renumbered_stats``); ``stats.json`` is LeRobot's ``aggregate_stats``
  of them (nothing decoded). ``tasks.parquet``: the kept episodes' tasks, renumbered densely.
- **demoforge files**: the sidecar rows of the kept episodes (``dataset_episode_index`` renumbered; the
  sub-task language rows in the data are per episode and copied as they are), and the marker: the kept
  episodes, the removed ones (an export never adds them again), what the edit did, every file's checksum.

``--trim`` keeps every episode and drops frames at the ends of some (``storage/lerobot/edit_trim.py`` decides the
cuts and re-bases rows, records, sub-task columns and statistics): a trimmed episode's video span is smart-cut
like any other, its rows are taken from its first kept frame, and its statistics are recomputed.

A re-run after a crash finishes the edit, or reports that the published version is already its result
(the marker records the edit), so an edit is never applied twice by accident.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np

from demoforge.storage.faults import ExportStep
from demoforge.storage.lerobot.edit_selection import Selection, SplitPart, allocate_split, episode_facts, select
from demoforge.storage.lerobot.edit_source import DatasetToEdit, EditError, open_dataset
from demoforge.storage.lerobot.edit_trim import (
    Cut,
    TrimSpec,
    camera_stats,
    numeric_stats,
    rebase_record,
    rebase_rows,
    rebase_subtasks,
    resolve_trims,
)
from demoforge.storage.lerobot.episode_filter import EpisodeFilter
from demoforge.storage.lerobot.files import DataFileWriter, next_file, write_episode_table
from demoforge.storage.lerobot.format import (
    CHUNKS_SIZE,
    DATA_PATH,
    MARKER,
    SIDECAR,
    VIDEO_PATH,
    ExportMarker,
    PublishedEpisode,
    RemovedEpisode,
    feature_differences,
    schema_differences,
)
from demoforge.storage.lerobot.output_guard import output_overlap
from demoforge.storage.lerobot.publish import (
    KEEP_VERSIONS,
    Published,
    check_writable,
    lock_exports,
    prune_versions,
    remove_unfinished,
    resolve_target,
)
from demoforge.storage.lerobot.rejected import (
    RejectedListError,
    Rejection,
    drop_rejections,
    read_rejections,
    rejected_list_path,
)
from demoforge.storage.lerobot_stats import vector_stats
from demoforge.storage.lerobot.subtasks import COLUMNS as SUBTASK_COLUMNS
from demoforge.storage.lerobot.version_builder import VersionBuilder, VersionMetadata
from demoforge.storage.lerobot.video_cut import CopyResult, Span, SpanCut, VideoFile, copy_spans
from demoforge.storage.paths import short_path
from demoforge.storage.write_errors import free_bytes, human_bytes

__all__ = ["EditError", "EditKeywords", "EditOutputs", "EditReport", "EditRules", "WrittenDataset", "edit_dataset",
           "merge_datasets"]

Progress = Callable[[str, int, int], None]  # (what, done, total)
RENUMBERED = ("episode_index", "index", "task_index")  # columns an edit rewrites (their stats are recomputed)

WRITTEN, DRY_RUN, UNCHANGED, ALREADY = "written", "dry run", "unchanged", "already done"


@dataclass(frozen=True)
class WrittenDataset:
    """One dataset an edit wrote (or would write, or found already written)."""

    dataset: Path
    status: str  # WRITTEN, DRY_RUN, UNCHANGED, ALREADY
    version: str | None
    episodes: int
    frames: int
    tasks: int
    video_files_copied: int = 0
    video_files_linked: int = 0
    reencoded_frames: int = 0
    reencoded_episodes: int = 0
    name: str | None = None  # a split part's name
    trimmed_episodes: int = 0  # --trim: episodes cut, and the frames dropped from them
    trimmed_frames: int = 0

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class EditReport:
    sources: tuple[str, ...]
    source_episodes: int
    removed: Mapping[str, int]  # reason -> episodes
    outputs: tuple[WrittenDataset, ...]
    elapsed_s: float
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "source_episodes": self.source_episodes, "removed": dict(self.removed),
                "outputs": [o.to_json() for o in self.outputs], "elapsed_s": round(self.elapsed_s, 3),
                "notes": list(self.notes)}


# ------------------------------------------------------------------------------------------- planning
Chosen = tuple[DatasetToEdit, int]  # a source and one of its episode indices


@dataclass
class _Run:
    """Output episodes of one camera whose frames come from one source mp4: linked whole, or copied."""

    key: str
    source: DatasetToEdit
    path: Path
    positions: list[int]  # indices into the output episode list
    spans: list[Span]
    link: bool = False
    cuts: list[SpanCut] = field(default_factory=list)  # what a copy re-encodes (known once analysed or written)


@dataclass
class _Plan:
    chosen: list[Chosen]
    tasks: dict[str, int]
    runs: dict[str, list[_Run]]
    frames: int
    trims: dict[int, Cut] = field(default_factory=dict)  # output position -> what --trim drops of it

    def length(self, position: int) -> int:
        source, index = self.chosen[position]
        cut = self.trims.get(position)
        return source.episodes[index].length - (cut.start + cut.end if cut else 0)

    @property
    def reencoded(self) -> tuple[int, int]:
        cuts = [c for runs in self.runs.values() for r in runs for c in r.cuts]
        return sum(c.reencoded for c in cuts), sum(1 for c in cuts if c.reencoded)

    def file_counts(self) -> tuple[int, int]:
        runs = [r for runs in self.runs.values() for r in runs]
        return sum(1 for r in runs if not r.link), sum(1 for r in runs if r.link)


def _plan(chosen: list[Chosen], *, analyse: bool = False, trims: Mapping[int, Cut] | None = None) -> _Plan:
    """Tasks, and for each camera the source files the output's episodes come from (linked when a file's
    episodes are all kept in their order, untrimmed; otherwise cut). ``analyse``: also say what each cut
    re-encodes (a dry run; a write learns it while it copies, reading each file once). ``trims``: frames
    dropped at each end of the episodes at these output positions."""
    trims = dict(trims or {})
    tasks: dict[str, int] = {}
    used: dict[int, set[str]] = {}
    for source, index in chosen:
        used.setdefault(id(source), set()).update(source.episodes[index].tasks)
    for source in dict.fromkeys(s for s, _ in chosen):
        for name in source.tasks:
            if name in used[id(source)]:
                tasks.setdefault(name, len(tasks))
    runs: dict[str, list[_Run]] = {}
    holders: dict[tuple[int, Path], list[int]] = {}  # every episode of each source file, in time order
    for source in dict.fromkeys(s for s, _ in chosen):
        for key in source.video_keys:
            placed = [(source.video_file(key, e.index), e.index) for e in source.episodes]
            for (path, start, _end), index in sorted(placed, key=lambda p: (str(p[0][0]), p[0][1])):
                holders.setdefault((id(source), path), []).append(index)
    keys = chosen[0][0].video_keys if chosen else []
    for key in keys:
        runs[key] = []
        for position, (source, index) in enumerate(chosen):
            path, start, end = source.video_file(key, index)
            cut = trims.get(position)
            span = Span(f"episode {index}", start, end, source.episodes[index].length) if cut is None else \
                Span(f"episode {index}", start + cut.start / source.fps, end - cut.end / source.fps,
                     source.episodes[index].length - cut.start - cut.end)
            last = runs[key][-1] if runs[key] else None
            if last is not None and last.source is source and last.path == path:
                last.positions.append(position)
                last.spans.append(span)
            else:
                runs[key].append(_Run(key, source, path, [position], [span]))
        for run in runs[key]:
            members = [chosen[p][1] for p in run.positions]
            run.link = members == holders[(id(run.source), run.path)] and not any(p in trims for p in run.positions)
            if not run.link and analyse:
                video = VideoFile(run.path, run.source.fps)
                run.cuts = [video.cut(span) for span in run.spans]
    frames = sum(source.episodes[index].length for source, index in chosen) - \
        sum(c.start + c.end for c in trims.values())
    return _Plan(chosen, tasks, runs, frames, trims)


def _estimate_bytes(plan: _Plan, out: Path) -> int:
    """A generous bound on what the new version adds to ``out``'s filesystem."""
    total = 4 << 20
    for runs in plan.runs.values():
        for run in runs:
            same_device = _device(run.path) == _device(out.parent)
            if not run.link or not same_device:
                total += run.path.stat().st_size
    files = {source.data_file(index) for source, index in plan.chosen}
    return total + sum(p.stat().st_size for p in files) + 8192 * len(plan.chosen)


def _device(path: Path) -> int | None:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return path.stat().st_dev
    except OSError:
        return None


# -------------------------------------------------------------------------------------------- writing
@dataclass(frozen=True)
class _Identity:
    """What a written dataset records about itself besides its episodes."""

    repo_id: str
    schema: Mapping[str, Any]
    edit: Mapping[str, Any]
    removed: tuple[RemovedEpisode, ...]


class _VersionWriter:
    """What an edit writes into a dataset version from a plan (the version itself is a :class:`VersionBuilder`'s):
    the videos, cut or linked; the kept rows, renumbered; the episode rows; then the small files' contents."""

    def __init__(self, version: VersionBuilder, plan: _Plan, identity: _Identity, progress: Progress | None) -> None:
        self.version, self.plan, self.identity = version, plan, identity
        self.progress = progress or (lambda _what, _done, _total: None)

    def write(self) -> VersionMetadata:
        build = self.version.path
        video_meta, cursors = self._videos(build)
        self.version.reach(ExportStep.AFTER_VIDEOS)
        data_spans, data_next = self._data(build)
        self.version.reach(ExportStep.AFTER_DATA)
        meta_next = self._episode_meta(build, video_meta, data_spans)
        return self._metadata(data_next, meta_next, cursors)

    def _videos(self, build: Path) -> tuple[list[dict[str, Any]], dict[str, tuple[int, int]]]:
        """Every camera's runs of episodes into its files; returns each output episode's video columns and
        where each camera's next file starts."""
        video_meta: list[dict[str, Any]] = [{} for _ in self.plan.chosen]
        cursors: dict[str, tuple[int, int]] = {}
        for key, runs in self.plan.runs.items():
            cursor = (0, 0)
            for i, run in enumerate(runs):
                self._video_run(build, run, cursor, video_meta)
                cursor = next_file(*cursor)
                self.progress(f"video {key}", i + 1, len(runs))
            cursors[key] = cursor
        return video_meta, cursors

    def _metadata(self, data_next: tuple[int, int], meta_next: tuple[int, int],
                  cursors: Mapping[str, tuple[int, int]]) -> VersionMetadata:
        plan, ident = self.plan, self.identity
        chosen = plan.chosen
        marker = ExportMarker(
            version=self.version.number, repo_id=ident.repo_id, schema=ident.schema, total_episodes=len(chosen),
            total_frames=plan.frames, tasks=plan.tasks, next_data=data_next, next_meta=meta_next,
            next_videos={key.removeprefix("observation.images."): c for key, c in cursors.items()},
            episodes=tuple(PublishedEpisode(episode_id, new, s.episodes[i].store_id) for new, (s, i)
                           in enumerate(chosen) if (episode_id := s.episodes[i].episode_id) is not None),
            removed=ident.removed, edit={**ident.edit, "reencoded_frames": plan.reencoded[0]})
        sidecar = [{**self._record(new), "dataset_episode_index": new} for new in range(len(chosen))] \
            if all(s.has_sidecar for s, _ in chosen) else []
        return VersionMetadata(tasks=plan.tasks, episode_stats=self._stats, info=self._info(), marker=marker,
                               sidecar=sidecar)

    def _record(self, position: int) -> dict[str, Any]:
        """The sidecar record of an output episode (re-based when it was trimmed)."""
        source, index = self.plan.chosen[position]
        record = dict(source.episodes[index].record or {})
        cut = self.plan.trims.get(position)
        return rebase_record(record, cut, self.plan.length(position)) if cut is not None else record

    # -- video
    def _video_run(self, build: Path, run: _Run, cursor: tuple[int, int], video_meta: list[dict[str, Any]]) -> None:
        out = build / VIDEO_PATH.format(video_key=run.key, chunk_index=cursor[0], file_index=cursor[1])
        out.parent.mkdir(parents=True, exist_ok=True)
        if run.link:
            spans = [(s.from_s, s.to_s) for s in run.spans]
            try:
                os.link(run.path, out)
            except OSError:  # another filesystem (a merge of datasets on two disks): a plain copy
                shutil.copyfile(run.path, out)
                self.version.wrote(out)
            else:
                self.version.linked(out, run.source.recorded_checksum(
                    run.path.relative_to(run.source.root).as_posix()))
        else:
            video = run.source.video(run.path)
            result: CopyResult = copy_spans(video, run.spans, out, run.source.features[run.key].get("info"))
            video.held = None  # copied (and shifted): a later part reads the file again
            spans = list(result.spans)
            run.cuts = list(result.cuts)
            self.version.wrote(out)
        for position, (start, end) in zip(run.positions, spans):
            video_meta[position].update({f"videos/{run.key}/chunk_index": cursor[0],
                                         f"videos/{run.key}/file_index": cursor[1],
                                         f"videos/{run.key}/from_timestamp": start,
                                         f"videos/{run.key}/to_timestamp": end})

    # -- data
    def _data(self, build: Path) -> tuple[list[tuple[int, int]], tuple[int, int]]:
        """The kept episodes' rows, renumbered: each source data file is read once, its kept rows taken and
        their three columns rewritten at once, then handed to the writer episode by episode (a trimmed one
        re-based first, and its statistics recomputed)."""
        import pyarrow as pa

        plan = self.plan
        chosen = plan.chosen
        writer = DataFileWriter(build, chosen[0][0].features, (0, 0))
        spans: list[tuple[int, int]] = []
        self._stats: list[dict[str, dict[str, np.ndarray]]] = []
        self._renumbered: list[dict[str, dict[str, np.ndarray]]] = []
        self._trimmed_stats: dict[int, dict[str, dict[str, np.ndarray]]] = {}
        frame = 0
        numbered = [(new, source, index) for new, (source, index) in enumerate(chosen)]
        try:  # one source file at a time (only its table is held)
            for (source, _path), group in itertools.groupby(numbered, key=lambda g: (g[1], g[1].data_file(g[2]))):
                members = list(group)
                starts = [source.data_rows(index) for _new, _source, index in members]
                table = starts[0][0]
                lengths = [plan.length(new) for new, _source, _index in members]
                firsts = [start + (cut.start if (cut := plan.trims.get(new)) else 0)
                          for (new, _source, _index), (_t, start) in zip(members, starts)]
                taken = table.take(np.concatenate([np.arange(first, first + n) for first, n in zip(firsts, lengths)]))
                mapping = np.asarray([plan.tasks.get(name, -1) for name in source.tasks], dtype=np.int64)
                total = sum(lengths)
                columns = {"episode_index": np.repeat(np.asarray([m[0] for m in members], dtype=np.int64), lengths),
                           "index": np.arange(frame, frame + total, dtype=np.int64),
                           "task_index": mapping[np.asarray(taken["task_index"].to_numpy())]}
                if (columns["task_index"] < 0).any():
                    raise EditError(f"{source.describe()}: an episode has frames of a task its metadata does not "
                                    "list")
                for name, values in columns.items():
                    field_ = taken.schema.field(name)
                    taken = taken.set_column(taken.column_names.index(name), field_, pa.array(values, type=field_.type))
                offset = 0
                for (new, _source, index), n in zip(members, lengths):
                    part = taken.slice(offset, n)
                    cut = plan.trims.get(new)
                    if cut is None:
                        stats = source.episode_stats(index)
                        mine = {name: values[offset:offset + n] for name, values in columns.items()}
                        self._renumbered.append(_renumbered_stats(stats, mine))
                        self._stats.append({**stats, **self._renumbered[-1]})
                    else:
                        success = (source.episodes[index].record or {}).get("success")
                        part = rebase_rows(part, cut, source.fps, None if success is None else bool(success))
                        stats = self._trimmed_episode_stats(source, index, cut, part)
                        self._trimmed_stats[new] = stats
                        self._renumbered.append({k: stats[k] for k in RENUMBERED if k in stats})
                        self._stats.append(stats)
                    spans.append(writer.add_table(part))
                    offset += n
                frame += total
                self.progress("data", members[-1][0] + 1, len(chosen))
        finally:
            data_next = writer.close()
        self.version.wrote(*writer.files)
        return spans, data_next

    def _trimmed_episode_stats(self, source: DatasetToEdit, index: int, cut: Cut, rows: Any
                               ) -> dict[str, dict[str, np.ndarray]]:
        """A trimmed episode's statistics, recomputed as LeRobot's writer computes them: every numeric column
        from its kept rows, each camera from LeRobot's sample of its kept frames (decoded from the source).
        The features and statistics the episode had before (a dataset without quantiles keeps none)."""
        old = source.episode_stats(index)
        new = numeric_stats(rows, source.features)
        for key in source.video_keys:
            path, start, end = source.video_file(key, index)
            new[key] = camera_stats(path, start + cut.start / source.fps, end - cut.end / source.fps, source.fps,
                                    rows.num_rows, source.features[key].get("info"))
        if not old:
            return new
        return {k: {stat: v for stat, v in new[k].items() if stat in old[k]} for k in old if k in new}

    # -- episode metadata, info, checksums
    def _episode_meta(self, build: Path, video_meta: list[dict[str, Any]],
                      data_spans: list[tuple[int, int]]) -> tuple[int, int]:
        import pyarrow as pa

        chosen = self.plan.chosen
        tables = []  # the kept rows, one take per run of episodes from the same source
        for source, run in itertools.groupby(chosen, key=lambda c: c[0]):
            tables.append(source.episodes_table.take([index for _source, index in run]))
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
        frame = 0
        columns: dict[str, list[Any]] = {name: [] for name in ("episode_index", "data/chunk_index", "data/file_index",
                                                                "dataset_from_index", "dataset_to_index")}
        for new, (chunk, file) in enumerate(data_spans):
            length = self.plan.length(new)
            for name, value in (("episode_index", new), ("data/chunk_index", chunk), ("data/file_index", file),
                                ("dataset_from_index", frame), ("dataset_to_index", frame + length)):
                columns[name].append(value)
            frame += length
        for name in video_meta[0] if video_meta else ():
            columns[name] = [m[name] for m in video_meta]
        for feature in RENUMBERED:
            for stat in (self._renumbered[0].get(feature) or {}):
                columns[f"stats/{feature}/{stat}"] = [np.asarray(r[feature][stat]).tolist() for r in self._renumbered]
        if self.plan.trims:
            columns.update(self._trimmed_meta(table, columns))
        for name, values in columns.items():
            if name not in table.column_names:
                raise EditError(f"{chosen[0][0].describe()}: meta/episodes has no column {name!r}")
            field_ = table.schema.field(name)
            table = table.set_column(table.column_names.index(name), field_, pa.array(values).cast(field_.type))
        meta_next, files = write_episode_table(build, table, (0, 0))
        self.version.wrote(*files)
        return meta_next

    def _trimmed_meta(self, table: Any, done: Mapping[str, Any]) -> dict[str, list[Any]]:
        """The ``meta/episodes`` columns a trim changes, for every row: ``length``, every statistic of a trimmed
        episode, and SARM's sub-task columns re-based onto its kept frames."""
        plan = self.plan
        out: dict[str, list[Any]] = {"length": [plan.length(p) for p in range(len(plan.chosen))]}
        for name in table.column_names:
            feature, _, stat = name.removeprefix("stats/").rpartition("/")
            if not name.startswith("stats/") or name in done:
                continue
            values = table[name].to_pylist()
            for position, stats in self._trimmed_stats.items():
                if stat in stats.get(feature, {}):
                    values[position] = np.asarray(stats[feature][stat]).tolist()
            out[name] = values
        subtasks = [c for c in SUBTASK_COLUMNS if c in table.column_names]
        if subtasks:
            rows = table.select(subtasks).to_pylist()
            for position, cut in plan.trims.items():
                source, _index = plan.chosen[position]
                if rows[position].get(subtasks[0]) is not None:
                    rows[position].update(rebase_subtasks(rows[position], cut, plan.length(position), source.fps))
            out.update({c: [r.get(c) for r in rows] for c in subtasks})
        return out

    def _info(self) -> dict[str, Any]:
        """The first source's ``info.json`` with the edited counts (and the layout this writer uses)."""
        info = dict(self.plan.chosen[0][0].info)
        count = len(self.plan.chosen)
        info.update(total_episodes=count, total_frames=self.plan.frames, total_tasks=len(self.plan.tasks),
                    chunks_size=CHUNKS_SIZE, data_path=DATA_PATH, splits={"train": f"0:{count}"})
        if self.plan.runs:
            info["video_path"] = VIDEO_PATH
        return info


def _renumbered_stats(stats: Mapping[str, Mapping[str, np.ndarray]], columns: Mapping[str, np.ndarray]
                      ) -> dict[str, dict[str, np.ndarray]]:
    """The per-episode statistics of the renumbered columns, for the new values: a constant column
    (``episode_index``, the ``task_index`` of a one-task episode) has the value as every statistic and std 0;
    ``index`` moved by an offset moves its statistics by it; anything else is recomputed as LeRobot's
    ``compute_episode_stats`` computes a numeric column. Only the columns the episode has statistics of."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, values in columns.items():
        old = stats.get(name)
        if old is None:
            continue
        if len(values) and values.min() == values.max():
            out[name] = {k: np.asarray(v) if k == "count" else
                         np.zeros_like(np.asarray(v)) if k == "std" else
                         np.full_like(np.asarray(v), values[0]) for k, v in old.items()}
        elif name == "index" and "min" in old:
            offset = int(values[0]) - int(np.asarray(old["min"]).reshape(-1)[0])
            out[name] = {k: np.asarray(v) if k in ("count", "std") else np.asarray(v) + offset
                         for k, v in old.items()}
        else:
            out[name] = vector_stats(np.asarray(values))
    return out


# ----------------------------------------------------------------------------------------- publishing
def _foreign_schema(source: DatasetToEdit) -> dict[str, Any]:
    """The marker's schema of a dataset made from one demoforge did not write: its features, so an export of a
    store into it is refused with the differences named."""
    return {"lerobot_features": {k: [f.get("dtype"), list(f.get("shape") or ())] for k, f in source.features.items()},
            "fps": source.fps}


def _identity(sources: Sequence[DatasetToEdit], chosen: Sequence[Chosen], repo_id: str | None, operation: str,
              suffix: str = "", request: str | None = None) -> _Identity:
    first = sources[0]
    base = first.marker.repo_id if first.marker is not None else f"local/{first.path.name}"
    kept = {(s.episodes[i].store_id, s.episodes[i].episode_id) for s, i in chosen}
    removed: dict[tuple[str | None, str], RemovedEpisode] = {}
    for source in sources:
        for r in source.marker.removed if source.marker else ():
            removed[(r.store_id, r.episode_id)] = r
        for e in source.episodes:
            if e.episode_id is not None and (e.store_id, e.episode_id) not in kept:
                removed[(e.store_id, e.episode_id)] = RemovedEpisode(e.episode_id, e.store_id)
    for key in kept:
        removed.pop(key, None)  # type: ignore[arg-type]
    schema = dict(first.marker.schema) if first.marker is not None else _foreign_schema(first)
    edit: dict[str, Any] = {"operation": operation,
                            "from": [{"version": s.version, "digest": s.digest()} for s in sources]}
    if request is not None:
        edit["request"] = request
    return _Identity(repo_id or base + suffix, schema, edit, tuple(removed.values()))


def _already(target: Published, identity: _Identity) -> bool:
    """Whether ``target``'s published version is the result of this very edit (a re-run after it finished)."""
    edit = (target.marker.edit if target.marker is not None else None) or {}
    return edit.get("operation") == identity.edit["operation"] and edit.get("from") == identity.edit["from"]


def _check_new_output(out: Path, identity: _Identity, sources: Sequence[DatasetToEdit]) -> Published:
    """A new sibling dataset's target: free, or already this edit's result; never inside a source."""
    why = output_overlap(out, {f"source dataset {n + 1}" if len(sources) > 1 else "the source dataset": source.path
                               for n, source in enumerate(sources)})
    if why is not None:
        raise EditError(f"{why}; write the new dataset elsewhere; nothing was written")
    target = resolve_target(out)  # refuses a foreign dataset or a non-empty folder there
    if target.marker is not None and not _already(target, identity):
        raise EditError(f"{short_path(out)} already holds a dataset (version {target.current and target.current.name}) "
                        "that is not the result of this edit; choose a new folder (nothing was written)")
    return target


def _write(target: Published, plan: _Plan, identity: _Identity, number: int, progress: Progress | None,
           name: str | None = None) -> WrittenDataset:
    needed, free = _estimate_bytes(plan, target.root), free_bytes(target.root.parent)
    if free is not None and free < needed:
        raise EditError(f"not enough free space to write {target.root}: it needs about {human_bytes(needed)}, and "
                        f"{human_bytes(free)} is free there; nothing was written")
    with VersionBuilder(target, number) as version:
        version.publish(_VersionWriter(version, plan, identity, progress).write())
    prune_versions(target.versions, keep=KEEP_VERSIONS)
    return _outcome(target.root, WRITTEN, version.name, plan, name)


def _outcome(path: Path, status: str, version: str | None, plan: _Plan, name: str | None = None) -> WrittenDataset:
    copied, linked = plan.file_counts()
    frames, episodes = plan.reencoded
    return WrittenDataset(path, status, version, len(plan.chosen), plan.frames, len(plan.tasks), copied, linked,
                          frames, episodes, name, trimmed_episodes=len(plan.trims),
                          trimmed_frames=sum(c.start + c.end for c in plan.trims.values()))


@contextlib.contextmanager
def _locked(versions: Path) -> Iterator[None]:
    fd = lock_exports(versions)
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _reading(sources: Sequence[DatasetToEdit]) -> Iterator[None]:
    """Hold the export lock of every demoforge source while it is read: no export or edit publishes (and
    prunes) versions of it meanwhile."""
    with contextlib.ExitStack() as stack:
        for source in sources:
            if source.published is not None:
                stack.enter_context(_locked(source.published.versions))
        yield


# ----------------------------------------------------------------------------------------- operations
@dataclass(frozen=True)
class EditRules:
    """What an edit does to a dataset's episodes: which it deletes or keeps (``edit_selection.select``), or, with
    ``trim``, which frames it drops at their ends (``keep_where`` then chooses the episodes trimmed;
    ``storage/lerobot/edit_trim.py``)."""

    delete: str | None = None  # dataset indices: "1,3-4"
    delete_rejected: bool = False  # the episodes the viewer marked rejected
    keep_where: EpisodeFilter | None = None
    task: str | None = None  # only this task's episodes
    replay: Mapping[int, str] | None = None  # a replay report's outcome per episode (``keep_where``'s ``replay``)
    trim: TrimSpec | None = None

    def request(self) -> str:
        """The rules as the marker of the version they made records them."""
        asked: dict[str, Any] = {"delete": self.delete, "delete_rejected": self.delete_rejected, "task": self.task,
                                 "keep_where": self.keep_where.canonical() if self.keep_where else None}
        if self.trim is not None:
            asked["trim"] = self.trim.canonical()
        return json.dumps(asked, sort_keys=True)

    @property
    def repeatable(self) -> bool:
        """Whether applying the rules twice does what applying them once does: deleting by index and trimming
        do not (the same indices name other episodes in the next version; a trim drops more frames each time)."""
        return self.delete is None and self.trim is None


@dataclass(frozen=True)
class EditOutputs:
    """Where an edit's result goes: the dataset's next version (nothing set), a new dataset at ``out``, or one
    dataset per ``split`` part under ``out_root`` (drawn with ``seed``, balanced by ``stratify``)."""

    out: Path | str | None = None
    split: Sequence[SplitPart] | None = None
    out_root: Path | str | None = None
    seed: int = 0
    stratify: str | None = None
    repo_id: str | None = None  # the new datasets' repo id (default: the source's, a part's name appended)

    @property
    def in_place(self) -> bool:
        return self.split is None and self.out is None


class EditKeywords(TypedDict, total=False):
    """:func:`edit_dataset`'s keyword form: the fields of :class:`EditRules` and :class:`EditOutputs` by name."""

    delete: str | None
    delete_rejected: bool
    keep_where: EpisodeFilter | None
    task: str | None
    replay: Mapping[int, str] | None
    trim: TrimSpec | None
    out: Path | str | None
    split: Sequence[SplitPart] | None
    out_root: Path | str | None
    seed: int
    stratify: str | None
    repo_id: str | None


def edit_dataset(path: Path | str, rules: EditRules | None = None, outputs: EditOutputs | None = None, *,
                 dry_run: bool = False, again: bool = False, progress: Progress | None = None,
                 **keywords: Unpack[EditKeywords]) -> EditReport:
    """Keep the episodes the rules select (see ``edit_selection.select``) and publish them: as the dataset's
    next version (in place), as a new dataset at ``out``, or split into ``out_root/<part>`` datasets.
    The rules and outputs are given as the two objects or by their fields' names (``delete="1,3"``), not both.
    ``again``: apply rules that are not repeatable to a version they made. ``dry_run``: say, write nothing."""
    rules, outputs = _rules_and_outputs(rules, outputs, keywords)
    started = time.monotonic()
    path = Path(path)
    _check_rules(rules, outputs)
    if outputs.in_place and not dry_run and ((path / MARKER).is_file() or path.is_symlink()):
        with _locked(resolve_target(path).versions):  # read under the lock: the version published stays so
            source = open_dataset(path)
            assert source.published is not None
            remove_unfinished(source.published.versions, source.published.current)
            return _edit(_Request(source, rules, outputs, False, again, progress, started))
    source = open_dataset(path)
    if outputs.in_place and source.foreign:
        raise EditError(f"{short_path(path)} is a LeRobot dataset demoforge did not write; demoforge never modifies "
                        "it: write the edit as a new dataset with --out DIR (or split it with --split)")
    with _reading([source] if not dry_run else []):
        return _edit(_Request(source, rules, outputs, dry_run, again, progress, started))


def _rules_and_outputs(rules: EditRules | None, outputs: EditOutputs | None,
                       keywords: EditKeywords) -> tuple[EditRules, EditOutputs]:
    if keywords and (rules is not None or outputs is not None):
        raise TypeError("give an edit's rules and outputs as EditRules and EditOutputs or by name, not both")
    fields: dict[str, Any] = dict(keywords)
    taken = {f.name for f in dataclasses.fields(EditRules)}
    return (rules or EditRules(**{k: v for k, v in fields.items() if k in taken}),
            outputs or EditOutputs(**{k: v for k, v in fields.items() if k not in taken}))


def _check_rules(rules: EditRules, outputs: EditOutputs) -> None:
    """Refuse rules and outputs that do not go together (nothing is read yet)."""
    if rules.trim is not None and (rules.delete is not None or rules.delete_rejected or rules.task is not None
                                   or outputs.split is not None):
        raise EditError("--trim is an edit of its own (with --keep-where choosing the episodes it trims): delete, "
                        "filter or split in another edit, before or after it")
    if outputs.split is not None and outputs.out is not None:
        raise EditError("--split writes one dataset per part under --out-root; --out names a single dataset: give one")
    if outputs.split is not None and outputs.out_root is None:
        raise EditError("--split needs --out-root DIR: each part becomes the dataset DIR/<part>")
    if outputs.split is None and outputs.out_root is not None:
        raise EditError("--out-root is for --split; to write the edit as a new dataset use --out")


@dataclass(frozen=True)
class _Request:
    """One edit of one opened dataset, as asked."""

    source: DatasetToEdit
    rules: EditRules
    outputs: EditOutputs
    dry_run: bool
    again: bool
    progress: Progress | None
    started: float


def _rejected(source: DatasetToEdit) -> tuple[list[int], list[Rejection]]:
    """Indices of the viewer's rejected episodes in ``source``, and the entries whose episodes are gone."""
    path = rejected_list_path(source.path)
    try:
        entries = read_rejections(path)
    except RejectedListError as exc:
        raise EditError(str(exc)) from None
    by_id = {(e.store_id, e.episode_id): e.index for e in source.episodes if e.episode_id is not None}
    found: list[int] = []
    gone: list[Rejection] = []
    for entry in entries:
        if entry.episode_id is not None:
            index = by_id.get((entry.store_id, entry.episode_id))
            if index is None:
                gone.append(entry)
            else:
                found.append(index)
        elif entry.version == source.version and 0 <= entry.dataset_index < len(source.episodes):
            found.append(entry.dataset_index)
        else:
            raise EditError(f"{path}: episode {entry.dataset_index} was rejected in version {entry.version}, and "
                            f"{source.describe()} records no ids that say which episode that is now; mark it again "
                            "in the viewer (nothing was written)")
    return sorted(set(found)), gone


def _edit(req: _Request) -> EditReport:
    source, rules, outputs = req.source, req.rules, req.outputs
    if outputs.in_place and not rules.repeatable and not req.again:
        done = _already_applied(req)
        if done is not None:
            return done
    rejected, gone = _rejected(source) if rules.delete_rejected else ([], [])
    selection, cuts = _selection(source, rules, rejected)
    notes: list[str] = []
    if rules.delete_rejected:
        if gone:
            notes.append(f"{len(gone)} rejected episode(s) are no longer in the dataset (deleted earlier)")
        if not rejected and not gone:
            notes.append(f"no episode is marked rejected ({rejected_list_path(source.path)} lists none)")

    def report(*written: WrittenDataset) -> EditReport:
        return EditReport((source.describe(),), len(source.episodes), selection.counts(), written,
                          time.monotonic() - req.started, tuple(notes))

    if outputs.split is not None:
        return report(*_write_split(req, selection))
    chosen = [(source, i) for i in selection.kept]
    trims = {position: cuts[i] for position, (_s, i) in enumerate(chosen) if i in cuts}
    if rules.trim is not None and not trims:
        notes.append(f"--trim {rules.trim.canonical()} drops no frame of the episodes it applies to")
    if outputs.out is not None:
        identity = _identity([source], chosen, outputs.repo_id, selection.operation or "copy")
        target = _check_new_output(Path(outputs.out), identity, [source])
        return report(_publish_new(target, _plan(chosen, analyse=req.dry_run, trims=trims), identity, req.dry_run,
                                   req.progress))
    return report(_write_in_place(req, selection, chosen, trims, gone))


def _already_applied(req: _Request) -> EditReport | None:
    """A re-run of the request that made the published version: reported, not applied again."""
    source = req.source
    previous = (source.marker.edit if source.marker is not None else None) or {}
    if previous.get("request") != req.rules.request():
        return None
    note = (f"version {source.version} is already the result of this edit ({previous.get('operation')}) of "
            f"{(previous.get('from') or [{}])[0].get('version')}; nothing was changed (--again applies it to "
            f"{source.version} too)")
    return EditReport((source.describe(),), len(source.episodes), {}, (WrittenDataset(
        source.path, ALREADY, source.version, len(source.episodes), sum(e.length for e in source.episodes),
        len(source.tasks)),), time.monotonic() - req.started, (note,))


def _selection(source: DatasetToEdit, rules: EditRules, rejected: list[int]) -> tuple[Selection, dict[int, Cut]]:
    """The episodes the rules keep (and, for a trim, the cut of each trimmed one); refuses keeping none."""
    cuts: dict[int, Cut] = {}
    if rules.trim is not None:
        selection, cuts = _trim_selection(source, rules.trim, rules.keep_where, rules.replay)
    else:
        selection = select(source, delete=rules.delete, rejected=rejected, keep_where=rules.keep_where,
                           task=rules.task, replay=rules.replay)
    if not selection.kept:
        raise EditError(f"the edit would leave no episode of the {len(source.episodes)} in {source.describe()} "
                        f"({_reasons(selection)}); nothing was written")
    return selection, cuts


def _write_split(req: _Request, selection: Selection) -> list[WrittenDataset]:
    """Each part of a split as a new dataset under ``out_root`` (every part checked before any is written)."""
    source, outputs = req.source, req.outputs
    split = outputs.split
    assert split is not None and outputs.out_root is not None
    parts = allocate_split([source.episodes[i] for i in selection.kept], split, outputs.seed, outputs.stratify)
    operation = (f"{selection.operation}; " if selection.operation else "") + \
        "split " + ",".join(f"{p.name}={p.fraction:g}" for p in split) + f" seed={outputs.seed}" + \
        (f" stratify={outputs.stratify}" if outputs.stratify else "")
    jobs = []
    for part in split:
        chosen = [(source, i) for i in parts[part.name]]
        identity = _identity([source], chosen, None if outputs.repo_id is None else f"{outputs.repo_id}_{part.name}",
                             f"{operation} part={part.name}", suffix=f"_{part.name}")
        jobs.append((part.name, chosen, identity, _check_new_output(Path(outputs.out_root) / part.name, identity,
                                                                    [source])))
    return [_publish_new(target, _plan(chosen, analyse=req.dry_run), identity, req.dry_run, req.progress, name)
            for name, chosen, identity, target in jobs]


def _write_in_place(req: _Request, selection: Selection, chosen: list[Chosen], trims: Mapping[int, Cut],
                    gone: list[Rejection]) -> WrittenDataset:
    """The edit as the dataset's next version (unchanged when it removes and trims nothing)."""
    source, rules = req.source, req.rules
    published = source.published
    assert published is not None and source.marker is not None
    if not selection.removed and not trims:
        if rules.delete_rejected and gone and not req.dry_run:
            drop_rejections(rejected_list_path(source.path), gone)
        return WrittenDataset(source.path, UNCHANGED, source.version, len(source.episodes),
                              sum(e.length for e in source.episodes), len(source.tasks))
    identity = _identity([source], chosen, req.outputs.repo_id or source.marker.repo_id, selection.operation,
                         request=rules.request())
    plan = _plan(chosen, analyse=req.dry_run, trims=trims)
    if req.dry_run:
        return _outcome(source.path, DRY_RUN, None, plan)
    check_writable(source.path.parent)
    written = _write(published, plan, identity, source.marker.version + 1, req.progress)
    if rules.delete_rejected:  # the list keeps only what is still in the dataset (marked meanwhile, in the viewer)
        stays = {(source.episodes[i].store_id, source.episodes[i].episode_id) for i in selection.kept}
        listed = read_rejections(rejected_list_path(source.path))
        drop_rejections(rejected_list_path(source.path),
                        [e for e in listed if e.episode_id is None or (e.store_id, e.episode_id) not in stays])
    return written


def _trim_selection(source: DatasetToEdit, trim: TrimSpec, keep_where: EpisodeFilter | None,
                    replay: Mapping[int, str] | None) -> tuple[Selection, dict[int, Cut]]:
    """Every episode kept, and what ``--trim`` drops of those ``--keep-where`` matches (all without it)."""
    if keep_where is not None and "replay" in keep_where.fields and replay is None:
        raise EditError("--keep-where names `replay`, but no --replay-report was given (save one with "
                        "`demoforge replay DATASET --json > replay.json`)")
    targets = [e.index for e in source.episodes if keep_where is None or keep_where(episode_facts(e, replay))]
    operation = f"trim {trim.canonical()}" + (f" where {keep_where.canonical()}" if keep_where else "")
    return Selection(tuple(e.index for e in source.episodes), {}, operation), resolve_trims(source, trim, targets)


def _publish_new(target: Published, plan: _Plan, identity: _Identity, dry_run: bool, progress: Progress | None,
                 name: str | None = None) -> WrittenDataset:
    """A new dataset at ``target`` (a copy, a split part, a merge): written, or found already written."""
    if target.marker is not None:  # checked by _check_new_output: the same edit, published by an earlier run
        return _outcome(target.root, ALREADY, target.current.name if target.current else None, plan, name)
    if dry_run:
        return _outcome(target.root, DRY_RUN, None, plan, name)
    check_writable(target.root.parent)
    with _locked(target.versions):
        fresh = resolve_target(target.root)
        if fresh.marker is not None:
            if _already(fresh, identity):
                return _outcome(target.root, ALREADY, fresh.current.name if fresh.current else None, plan, name)
            raise EditError(f"{short_path(target.root)} was written by another process meanwhile; nothing was written")
        remove_unfinished(fresh.versions, fresh.current)
        return _write(fresh, plan, identity, 1, progress, name)


def _reasons(selection: Selection) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in selection.counts().items()) or "nothing removed"


def _merge_differences(first: DatasetToEdit, other: DatasetToEdit) -> list[str]:
    """How two datasets' features differ, each difference once: by ``info.json``, then what only demoforge's
    markers record (its schema names the same cameras, shapes and codecs in other words: those are left out)."""
    diffs = feature_differences(first.features, other.features, str(first.path), str(other.path))
    if first.fps != other.fps:
        diffs.insert(0, f"fps: {first.fps} in {first.path}, {other.fps} in {other.path}")
    if first.marker is None or other.marker is None:
        return diffs
    subjects = [d.split(": ", 1)[0] for d in diffs]
    features = {s.split(" ", 1)[0] for s in subjects}
    keys = {s.split(" ", 1)[1] for s in subjects if " " in s}
    for d in schema_differences(first.marker.schema, other.marker.schema, str(first.path), str(other.path)):
        subject = d.split(": ", 1)[0]
        video = subject.startswith(("video ", "depth video ")) and subject.rsplit(" ", 1)[1] in keys
        if subject not in subjects and subject.split(" ", 1)[0] not in features and not video:
            diffs.append(d)
    return diffs


def merge_datasets(paths: Sequence[Path | str], out: Path | str, *, repo_id: str | None = None,
                   dry_run: bool = False, progress: Progress | None = None) -> EditReport:
    """Every episode of every dataset, in the order given, as one new dataset at ``out``: features checked by
    name first (nothing is written when they differ), tasks united, indices renumbered from 0."""
    started = time.monotonic()
    if len(paths) < 2:
        raise EditError("merge needs two or more datasets")
    sources = [open_dataset(p) for p in paths]
    first = sources[0]
    for other in sources[1:]:
        # What a merge cannot mix is segment records for some episodes and none for others; whether demoforge or
        # LeRobot's writer made a dataset without them does not matter (an edit of a foreign dataset is one).
        if other.has_sidecar != first.has_sidecar:
            segmented, plain = (first, other) if first.has_sidecar else (other, first)
            raise EditError(f"cannot merge {segmented.describe()} with {plain.describe()}: the first carries "
                            f"demoforge's segment records ({SIDECAR}) and the second has none, and a "
                            "dataset has them for every episode or for none; nothing was written")
        diffs = _merge_differences(first, other)
        if diffs:
            raise EditError(f"cannot merge {other.path} with {first.path}: their features differ ("
                            + "; ".join(diffs) + "); a dataset holds one feature layout; nothing was written")
    seen: dict[tuple[str | None, str], Path] = {}
    for source in sources:
        for e in source.episodes:
            if e.episode_id is None:
                continue
            if (e.store_id, e.episode_id) in seen:
                raise EditError(f"{source.path} and {seen[(e.store_id, e.episode_id)]} both hold staging episode "
                                f"{e.episode_id} of store {e.store_id} (a dataset holds each episode once: are they "
                                "the same dataset, or copies?); nothing was written")
            seen[(e.store_id, e.episode_id)] = source.path
    chosen = [(s, e.index) for s in sources for e in s.episodes]
    identity = _identity(sources, chosen, repo_id, "merge")
    target = _check_new_output(Path(out), identity, sources)
    with _reading(sources if not dry_run else []):
        written = _publish_new(target, _plan(chosen, analyse=dry_run), identity, dry_run, progress)
    return EditReport(tuple(s.describe() for s in sources), len(chosen), {}, (written,),
                      time.monotonic() - started)
