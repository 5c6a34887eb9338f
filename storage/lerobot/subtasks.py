"""Segments as LeRobot's sub-task annotation columns and temporal-proportion files (what SARM reads).

LeRobot fills these with a vision-language annotator at second resolution; demoforge knows every segment's
span to the frame, so an export writes them exactly. Per episode, in ``meta/episodes``:
``{sparse|dense}_subtask_names`` (one entry per segment), ``_subtask_start_frames`` and ``_subtask_end_frames``
(inclusive, as LeRobot's ``find_stage_and_tau`` reads them) and ``_subtask_start_times`` / ``_end_times``
(seconds: frame / fps, what ``load_annotations_from_dataset`` reads). demoforge's segments have one level, so
the sparse and dense columns hold the same rows. Per dataset, ``meta/temporal_proportions_{sparse|dense}.json``:
each sub-task's mean share of its episodes' frames (SARM's formula (1), over frames instead of LeRobot's
whole seconds), normalised to sum to 1, in order of first appearance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODES = ("sparse", "dense")
SUFFIXES = ("subtask_names", "subtask_start_frames", "subtask_end_frames", "subtask_start_times",
            "subtask_end_times")
PROPORTIONS_PATH = "meta/temporal_proportions_{mode}.json"
COLUMNS = tuple(f"{mode}_{suffix}" for mode in MODES for suffix in SUFFIXES)


def subtask_columns(segments: Sequence[Mapping[str, Any]], fps: int) -> dict[str, list[Any]]:
    """An episode's sub-task columns from its recorded segments (spans ``[start_step, end_step)``)."""
    names = [str(s["name"]) for s in segments]
    starts = [int(s["start_step"]) for s in segments]
    ends = [int(s["end_step"]) - 1 for s in segments]
    values: dict[str, list[Any]] = {"subtask_names": list(names), "subtask_start_frames": starts, "subtask_end_frames": ends,
              "subtask_start_times": [f / fps for f in starts], "subtask_end_times": [f / fps for f in ends]}
    return {f"{mode}_{suffix}": list(values[suffix]) for mode in MODES for suffix in SUFFIXES}


def arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    types = {"subtask_names": pa.list_(pa.string()), "subtask_start_frames": pa.list_(pa.int64()),
             "subtask_end_frames": pa.list_(pa.int64()), "subtask_start_times": pa.list_(pa.float64()),
             "subtask_end_times": pa.list_(pa.float64())}
    return {f"{mode}_{suffix}": types[suffix] for mode in MODES for suffix in SUFFIXES}


def temporal_proportions(episodes: Iterable[tuple[Sequence[str], Sequence[int], Sequence[int], int]]
                         ) -> dict[str, float]:
    """Each sub-task's mean share of an episode, over the episodes it appears in, normalised to sum to 1.

    ``episodes``: (names, start frames, end frames inclusive, length) per episode. A name that appears
    several times in one episode counts all its frames."""
    shares: dict[str, list[float]] = {}
    for names, starts, ends, length in episodes:
        if length <= 0:
            continue
        per_episode: dict[str, int] = {}
        for name, start, end in zip(names, starts, ends, strict=True):
            per_episode[name] = per_episode.get(name, 0) + int(end) - int(start) + 1
        for name, frames in per_episode.items():
            shares.setdefault(name, []).append(frames / length)
    means = {name: float(np.mean(values)) for name, values in shares.items()}
    total = sum(means.values())
    return {name: value / total for name, value in means.items()} if total > 0 else means


def write_temporal_proportions(build: Path, meta_glob: str = "meta/episodes/chunk-*/file-*.parquet") -> list[Path]:
    """Write both proportion files from every episode row of the dataset being built (nothing when no row
    carries sub-task columns: a dataset exported before them)."""
    import pyarrow.parquet as pq

    rows: list[tuple[Sequence[str], Sequence[int], Sequence[int], int]] = []
    for file in sorted(build.glob(meta_glob)):
        table = pq.read_table(file)
        if "dense_subtask_names" not in table.column_names:
            continue
        data = table.select(["dense_subtask_names", "dense_subtask_start_frames", "dense_subtask_end_frames",
                             "length"]).to_pydict()
        rows += [(n, s, e, int(length)) for n, s, e, length in zip(
            data["dense_subtask_names"], data["dense_subtask_start_frames"], data["dense_subtask_end_frames"],
            data["length"]) if n is not None]
    if not rows:
        return []
    proportions = temporal_proportions(rows)
    written = []
    for mode in MODES:
        path = build / PROPORTIONS_PATH.format(mode=mode)
        path.unlink(missing_ok=True)  # may be a hard link to the published version: never write through it
        path.write_text(json.dumps(proportions, indent=2) + "\n")
        written.append(path)
    return written
