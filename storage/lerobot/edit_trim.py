"""``demoforge edit --trim``: frames dropped at an episode's start and end, by counts or by named segments.

What is decided here (nothing writes): the spec (``start=N,end=M`` or ``segments=idle+retreat``), each episode's
cut (refused, with nothing written, when it would empty an episode, cut into a segment, or names no segment
the dataset has), and how a kept episode's rows, segment record, sub-task columns and statistics are re-based
onto its new first frame. ``storage/lerobot/edit.py`` writes the version: video spans cut with the smart cut
(only the frames up to the first keyframe re-encoded), everything else copied.

A segmented episode (a demoforge dataset) is cut between segments only, so every kept segment is whole and
its annotation columns (``segment_step``, start and end flags) stay as they were; ``episode_step`` and
``segment_id`` are shifted. An episode cut at its end ends where the recording was cut: its new last frame is
marked ``annotation.truncated`` and ``next.done`` (``next.success`` there is the episode's success, as an export
derives it); the sidecar keeps the outcome and records the frames trimmed (``trim``: cumulative).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.lerobot.edit_source import DatasetToEdit, EditError
from demoforge.storage.lerobot.format import depth_identity_of_info
from demoforge.storage.lerobot.subtasks import MODES

SEGMENT_NAME = re.compile(r"[^+,=\s][^+,=]*")
LANGUAGE_PERSISTENT = "language_persistent"
NOT_NUMERIC = ("video", "image", "language", "string")


@dataclass(frozen=True)
class TrimSpec:
    """Frames to drop: ``start``/``end`` counts, or the leading and trailing segments named in ``segments``."""

    start: int = 0
    end: int = 0
    segments: tuple[str, ...] = ()

    def canonical(self) -> str:
        if self.segments:
            return "segments=" + "+".join(self.segments)
        return ",".join(f"{k}={v}" for k, v in (("start", self.start), ("end", self.end)) if v)


def parse_trim(spec: str) -> TrimSpec:
    """``start=N,end=M`` (either or both, N and M whole numbers) or ``segments=NAME+NAME...``."""
    values: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or key not in ("start", "end", "segments") or not value.strip():
            raise EditError(f"--trim {spec!r}: {item.strip()!r} is not start=N, end=N or segments=NAME+NAME "
                            "(e.g. start=10,end=5 or segments=idle+retreat)")
        if key in values:
            raise EditError(f"--trim {spec!r}: {key} is given twice")
        values[key] = value.strip()
    if "segments" in values:
        if len(values) > 1:
            raise EditError(f"--trim {spec!r}: trim by counts (start=, end=) or by segments (segments=), not both")
        names = tuple(n.strip() for n in values["segments"].split("+"))
        if any(not SEGMENT_NAME.fullmatch(n) for n in names):
            raise EditError(f"--trim {spec!r}: name the segments joined by '+', e.g. segments=idle+retreat")
        return TrimSpec(segments=tuple(dict.fromkeys(names)))
    counts = {}
    for key, raw in values.items():
        if not raw.isdigit() or len(raw) > 9:
            raise EditError(f"--trim {spec!r}: {key}={raw} is not a number of frames (a whole number, 0 or more)")
        counts[key] = int(raw)
    trim = TrimSpec(start=counts.get("start", 0), end=counts.get("end", 0))
    if not trim.start and not trim.end:
        raise EditError(f"--trim {spec!r} drops no frame: give start=N and/or end=N above 0")
    return trim


@dataclass(frozen=True)
class Cut:
    """What a trim drops of one episode: ``start`` and ``end`` frames, ``segments_before`` whole segments at
    its start (the kept segments' ids move down by it)."""

    start: int
    end: int
    segments_before: int = 0


def _segments(record: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return sorted((record or {}).get("segments") or [], key=lambda s: int(s["start_step"]))


def resolve_trims(dataset: DatasetToEdit, spec: TrimSpec, targets: Sequence[int]) -> dict[int, Cut]:
    """Each target episode's cut (episodes the trim leaves as they are are left out). Raises EditError, naming
    the episode, for a cut that would empty it or fall inside one of its segments, and for a segment name that no
    episode of the dataset has."""
    if spec.segments:
        known = {str(s["name"]) for e in dataset.episodes for s in _segments(e.record)}
        if not known:
            raise EditError(f"--trim {spec.canonical()}: {dataset.describe()} records no segments; trim it by "
                            "frame counts (start=N,end=N); nothing was written")
        unknown = [n for n in spec.segments if n not in known]
        if unknown:
            raise EditError(f"--trim {spec.canonical()}: no segment is named {', '.join(map(repr, unknown))}; the "
                            f"dataset's segments are {', '.join(map(repr, sorted(known)))}; nothing was written")
    cuts: dict[int, Cut] = {}
    for index in targets:
        episode = dataset.episodes[index]
        cut = _by_segments(spec, index, episode.length, _segments(episode.record)) if spec.segments else \
            _by_counts(spec, index, episode.length, _segments(episode.record))
        if cut is not None and (cut.start or cut.end):
            cuts[index] = cut
    return cuts


def _by_segments(spec: TrimSpec, index: int, length: int, segments: list[Mapping[str, Any]]) -> Cut | None:
    names = set(spec.segments)
    first, last = 0, len(segments)
    while first < last and str(segments[first]["name"]) in names:
        first += 1
    while last > first and str(segments[last - 1]["name"]) in names:
        last -= 1
    if not segments:
        return None
    if first == last:
        raise EditError(f"--trim {spec.canonical()} would leave episode {index} empty (its segments are "
                        f"{'+'.join(str(s['name']) for s in segments)}); nothing was written")
    start = int(segments[first]["start_step"]) if first else 0
    end = length - int(segments[last - 1]["end_step"]) if last < len(segments) else 0
    return Cut(start, end, first)


def _by_counts(spec: TrimSpec, index: int, length: int, segments: list[Mapping[str, Any]]) -> Cut:
    if spec.start + spec.end >= length:
        raise EditError(f"--trim {spec.canonical()} would leave episode {index} ({length} frames) empty; nothing "
                        "was written")
    if not segments:
        return Cut(spec.start, spec.end)
    bounds = sorted({0, length} | {int(s["start_step"]) for s in segments} | {int(s["end_step"]) for s in segments})
    for at, what in ((spec.start, f"start={spec.start}"), (length - spec.end, f"end={spec.end}")):
        if at not in bounds:
            inside = next(s for s in segments if int(s["start_step"]) < at < int(s["end_step"]))
            raise EditError(f"--trim {what} cuts episode {index} at frame {at}, inside its segment "
                            f"{inside['name']!r} (frames {inside['start_step']}-{int(inside['end_step']) - 1}); a "
                            f"segmented episode is cut between segments (at frames {', '.join(map(str, bounds))}), "
                            "or trim whole segments with segments=NAME; nothing was written")
    return Cut(spec.start, spec.end, sum(1 for s in segments if int(s["end_step"]) <= spec.start))


# ---------------------------------------------------------------------------------------- re-basing
def rebase_rows(table: Any, cut: Cut, fps: int, success: bool | None) -> Any:
    """A trimmed episode's rows (already sliced) onto its new first frame: ``frame_index``, ``timestamp``,
    ``annotation.episode_step`` and ``annotation.segment_id`` from 0, sub-task rows shifted, and an episode cut
    at its end marked ended there (``annotation.truncated``, ``next.done``, ``next.success`` = ``success``)."""
    import pyarrow as pa

    n = table.num_rows
    names = set(table.column_names)
    new: dict[str, Any] = {}

    def ints(name: str) -> np.ndarray:
        return np.asarray(table[name].to_numpy(), dtype=np.int64).copy()

    if "frame_index" in names:
        new["frame_index"] = np.arange(n, dtype=np.int64)
    if "timestamp" in names:
        new["timestamp"] = (np.arange(n) / fps).astype(np.float32)
    if "annotation.episode_step" in names:
        new["annotation.episode_step"] = ints("annotation.episode_step") - cut.start
    if "annotation.segment_id" in names:
        new["annotation.segment_id"] = ints("annotation.segment_id") - cut.segments_before
    if cut.end and n:
        if {"annotation.truncated", "annotation.terminated"} <= names:
            truncated = ints("annotation.truncated")
            if not ints("annotation.terminated")[-1]:
                truncated[-1] = 1
            new["annotation.truncated"] = truncated
        if "next.done" in names:
            done = np.asarray(table["next.done"].to_numpy(zero_copy_only=False), dtype=bool).copy()
            done[-1] = True
            new["next.done"] = done
            if "next.success" in names and success is not None:
                succeeded = np.asarray(table["next.success"].to_numpy(zero_copy_only=False), dtype=bool).copy()
                succeeded[-1] = bool(success)
                new["next.success"] = succeeded
    if LANGUAGE_PERSISTENT in names:
        rows = table[LANGUAGE_PERSISTENT].to_pylist()
        new[LANGUAGE_PERSISTENT] = [shift_persistent(r, cut.start, n, fps) for r in rows]
    for name, values in new.items():
        field_ = table.schema.field(name)
        # pyarrow converts Python values to plain types only: the language rows' JSON ``tool_calls`` are built
        # as their storage (text), then cast to the schema's extension type.
        column = pa.array(values, type=_storage_type(field_.type)).cast(field_.type)
        table = table.set_column(table.column_names.index(name), field_, column)
    return table


def _storage_type(typ: Any) -> Any:
    """``typ`` with every extension type replaced by its storage type."""
    import pyarrow as pa

    if isinstance(typ, pa.BaseExtensionType):
        return _storage_type(typ.storage_type)
    if pa.types.is_struct(typ):
        return pa.struct([f.with_type(_storage_type(f.type)) for f in typ])
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        inner = typ.value_field.with_type(_storage_type(typ.value_type))
        return pa.large_list(inner) if pa.types.is_large_list(typ) else pa.list_(inner)
    return typ


def _shifted_time(t: float, frames: int, fps: int) -> float:
    """A time ``frames`` frames earlier, kept on the frame grid when it was on it (``k / fps``)."""
    on_grid = round(t * fps)
    if abs(t * fps - on_grid) < 1e-3:
        return (on_grid - frames) / fps
    return t - frames / fps


def shift_persistent(rows: list[dict[str, Any]] | None, start: int, n: int, fps: int) -> list[dict[str, Any]] | None:
    """LeRobot's persistent language rows of an episode whose first ``start`` frames were dropped and ``n`` kept:
    a row becomes active at its timestamp until the next of its style, so of the rows active before the new
    start the last of each style is kept at time 0, later ones move earlier, and those starting after the new
    last frame are dropped."""
    if rows is None:
        return None
    half = 0.5 / fps
    out: list[dict[str, Any]] = []
    latest_before: dict[Any, dict[str, Any]] = {}
    for row in rows:
        t = row.get("timestamp")
        if t is None:
            out.append(row)
            continue
        shifted = _shifted_time(float(t), start, fps)
        if shifted <= half:
            latest_before[row.get("style")] = {**row, "timestamp": 0.0}
        elif shifted < n / fps - half:
            out.append({**row, "timestamp": float(np.float32(shifted))})
    timed = sorted(list(latest_before.values()) + [r for r in out if r.get("timestamp") is not None],
                   key=lambda r: r["timestamp"])
    return [r for r in out if r.get("timestamp") is None] + timed


def rebase_record(record: Mapping[str, Any], cut: Cut, length: int) -> dict[str, Any]:
    """A sidecar record of a trimmed episode: its length, its kept segments shifted and renumbered from 0, the
    failed segment's id with them, and ``trim`` (frames dropped at each end, over every trim)."""
    old_length = int(record.get("length", length + cut.start + cut.end))
    kept = [s for s in _segments(record) if int(s["end_step"]) > cut.start
            and int(s["start_step"]) < old_length - cut.end]
    ids = {int(s["segment_id"]): new for new, s in enumerate(kept)}
    out = dict(record)
    out["length"] = length
    out["segments"] = [{**s, "segment_id": ids[int(s["segment_id"])], "start_step": int(s["start_step"]) - cut.start,
                        "end_step": int(s["end_step"]) - cut.start} for s in kept]
    failed = record.get("failed_segment")
    if isinstance(failed, Mapping) and failed.get("segment_id") is not None:
        out["failed_segment"] = {**failed, "segment_id": ids.get(int(failed["segment_id"]))}
    before = record.get("trim") or {}
    out["trim"] = {"start": int(before.get("start", 0)) + cut.start, "end": int(before.get("end", 0)) + cut.end}
    return out


def rebase_subtasks(row: Mapping[str, Any], cut: Cut, length: int, fps: int) -> dict[str, list[Any]]:
    """SARM's sub-task columns of a trimmed episode (``storage/lerobot/subtasks.py``): sub-tasks outside the kept
    frames dropped, the others shifted and clipped to them (frames inclusive; times in seconds)."""
    out: dict[str, list[Any]] = {}
    for mode in MODES:
        names = row.get(f"{mode}_subtask_names")
        if names is None:
            continue
        starts, ends = row[f"{mode}_subtask_start_frames"], row[f"{mode}_subtask_end_frames"]
        start_times, end_times = row[f"{mode}_subtask_start_times"], row[f"{mode}_subtask_end_times"]
        keep = [i for i in range(len(names)) if int(ends[i]) - cut.start >= 0 and int(starts[i]) - cut.start < length]
        last = (length - 1) / fps
        out[f"{mode}_subtask_names"] = [names[i] for i in keep]
        out[f"{mode}_subtask_start_frames"] = [max(int(starts[i]) - cut.start, 0) for i in keep]
        out[f"{mode}_subtask_end_frames"] = [min(int(ends[i]) - cut.start, length - 1) for i in keep]
        out[f"{mode}_subtask_start_times"] = [max(_shifted_time(float(start_times[i]), cut.start, fps), 0.0)
                                              for i in keep]
        out[f"{mode}_subtask_end_times"] = [min(_shifted_time(float(end_times[i]), cut.start, fps), last)
                                            for i in keep]
    return out


# --------------------------------------------------------------------------------------- statistics
def numeric_stats(table: Any, features: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """LeRobot's per-episode statistics (``compute_episode_stats``) of every numeric column of an episode's rows."""
    from demoforge.storage.lerobot_stats import vector_stats

    out: dict[str, dict[str, np.ndarray]] = {}
    for key, ft in features.items():
        if ft.get("dtype") in NOT_NUMERIC or key not in table.column_names:
            continue
        column = table[key].combine_chunks()
        shape = tuple(ft.get("shape") or (1,))
        values: np.ndarray = np.asarray(column.flatten().to_numpy(zero_copy_only=False)).reshape(table.num_rows, -1) \
            if len(shape) == 1 and shape != (1,) else np.asarray(column.to_numpy(zero_copy_only=False))
        out[key] = vector_stats(values)
    return out


def camera_stats(path: Path, from_s: float, to_s: float, fps: int, length: int,
                 info: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """A camera's statistics over the frames ``[from_s, to_s)`` of ``path``: LeRobot's sample of ``length``
    frames, decoded (depth maps dequantized to metres with the feature's quantizer)."""
    from demoforge.storage.depth import dequantize
    from demoforge.storage.lerobot_stats import depth_stats, rgb_stats, sample_indices, strided
    from demoforge.storage.video import decode_span

    wanted = sample_indices(length)
    depth = depth_identity_of_info(info or {})
    frames = decode_span(path, from_s, to_s, fps, pix_fmt="gray12le" if depth is not None else "rgb24")
    if len(frames) != length:
        raise EditError(f"{path}: {len(frames)} frame(s) shown in [{from_s:.4f}, {to_s:.4f}) s, expected {length}")
    if depth is not None:
        return depth_stats(np.stack([strided(dequantize(frames[i], depth)) for i in wanted]))
    return rgb_stats(strided(frames[i]) for i in wanted)
