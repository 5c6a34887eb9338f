"""Which episodes an edit keeps: ``--delete``, ``--task``, ``--keep-where`` (over each episode's facts) and the
deterministic ``--split`` of what is kept into named parts.

Everything here decides; nothing writes. Bad input raises :class:`~demoforge.storage.lerobot.edit_source.EditError`
(or ``FilterError`` / ``EpisodeSpecError``, both ValueErrors the CLI reports the same way).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demoforge.storage.episode_spec import (
    EpisodeSpecError,
    describe_numbers,
    parse_episode_ranges,
    resolve_episode_ranges,
)
from demoforge.storage.lerobot.edit_source import DatasetToEdit, EditError, SourceEpisode
from demoforge.storage.lerobot.episode_filter import EpisodeFilter, provenance_facts
from demoforge.storage.paths import short_path

SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
STRATIFY_KEYS = ("task",)


def episode_facts(episode: SourceEpisode, replay: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The values ``--keep-where`` sees for one episode (``episode_filter.FIELDS``); None where not recorded."""
    record = episode.record or {}
    segments = record.get("segments")
    if record:
        outcome = "success" if record.get("success") else str(record.get("terminal_reason") or "failure")
    else:
        outcome = "unknown"
    return {"index": episode.index, "length": episode.length, "task": episode.task,
            "job_task": record.get("task"), "outcome": outcome,
            "success": bool(record["success"]) if "success" in record else None,
            "segments": len(segments) if isinstance(segments, list) else None,
            "failed_segments": sum(1 for s in segments if not s.get("success", True))
            if isinstance(segments, list) else None,
            "seed": record.get("seed"), "attempt": record.get("attempt"),
            # A record without them is of an episode the expert drove alone (stages/contract.py).
            "driver": record.get("driver", "expert") if record else None,
            "interventions": int(record.get("interventions") or 0) if record else None,
            "kept_failure": bool(record.get("kept_failure", False)) if record else None,
            "failed_segment": (record.get("failed_segment") or {}).get("name") if record else None,
            "replay": (replay or {}).get(episode.index), **provenance_facts(record)}


def read_replay_report(path: Path, dataset: DatasetToEdit) -> dict[int, str]:
    """Replay verdicts by episode index from a ``demoforge replay DATASET --json`` report. Each entry must be of
    the episode now at its index (same seed and attempt): a report of another version is refused."""
    try:
        report = json.loads(Path(path).read_text())
        entries = [(int(e["number"]), int(e["seed"]), int(e["attempt"]), str(e["verdict"]))
                   for e in report["episodes"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EditError(f"--replay-report {short_path(path)}: not a `demoforge replay --json` report "
                        f"({type(exc).__name__}: {exc})") from None
    verdicts: dict[int, str] = {}
    for number, seed, attempt, verdict in entries:
        episode = dataset.episodes[number] if 0 <= number < len(dataset.episodes) else None
        record = (episode.record or {}) if episode is not None else {}
        if episode is None or record.get("seed") != seed or record.get("attempt") != attempt:
            raise EditError(f"--replay-report {short_path(path)}: its episode {number} (seed {seed}, attempt "
                            f"{attempt}) is not episode {number} of {dataset.describe()}; the report is of another "
                            "version: replay the dataset again")
        verdicts[number] = verdict
    return verdicts


@dataclass(frozen=True)
class Selection:
    """What an edit keeps of one dataset, and why the rest goes."""

    kept: tuple[int, ...]
    removed: Mapping[int, str] = field(default_factory=dict)  # index -> the first reason (deleted, filter, task)
    operation: str = ""  # a canonical description of what was asked (the marker records it)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for reason in self.removed.values():
            out[reason] = out.get(reason, 0) + 1
        return out


def select(dataset: DatasetToEdit, *, delete: str | None = None, rejected: Sequence[int] = (),
           keep_where: EpisodeFilter | None = None, task: str | None = None,
           replay: Mapping[int, str] | None = None) -> Selection:
    """The episodes every given rule keeps (rules combine: an episode stays only if none removes it)."""
    indices = [e.index for e in dataset.episodes]
    removed: dict[int, str] = {}
    ops: list[str] = []
    if delete is not None:
        try:
            named = resolve_episode_ranges(parse_episode_ranges(delete, "--delete"), indices, delete, "--delete")
        except EpisodeSpecError as exc:
            raise EditError(str(exc)) from None
        for i in named:
            removed.setdefault(i, "deleted")
        ops.append("delete " + describe_numbers(named).removeprefix("episodes "))
    if rejected:
        for i in rejected:
            removed.setdefault(i, "rejected in the viewer")
        ops.append("delete-rejected " + ",".join(dataset.episodes[i].identity for i in sorted(rejected)))
    if task is not None:
        known = sorted({t for e in dataset.episodes for t in e.tasks} |
                       {str(e.record["task"]) for e in dataset.episodes if e.record and "task" in e.record})
        if task not in known:
            raise EditError(f"--task {task!r}: no episode has that task; the dataset's tasks are "
                            + "; ".join(repr(t) for t in known))
        for e in dataset.episodes:
            if task not in e.tasks and (e.record or {}).get("task") != task:
                removed.setdefault(e.index, f"not task {task!r}")
        ops.append(f"task {json.dumps(task)}")
    if keep_where is not None:
        if "replay" in keep_where.fields and replay is None:
            raise EditError("--keep-where names `replay`, but no --replay-report was given (save one with "
                            "`demoforge replay DATASET --json > replay.json`)")
        for e in dataset.episodes:
            if not keep_where(episode_facts(e, replay)):
                removed.setdefault(e.index, "--keep-where")
        ops.append(f"keep-where {keep_where.canonical()}")
    kept = tuple(i for i in indices if i not in removed)
    return Selection(kept, dict(sorted(removed.items())), "; ".join(ops))


# ------------------------------------------------------------------------------------------- splits
@dataclass(frozen=True)
class SplitPart:
    name: str
    fraction: float


def parse_split(spec: str) -> tuple[SplitPart, ...]:
    """``train=0.9,val=0.1``: names (letters, digits, ``_.-``; each a folder under --out-root) and fractions
    that add up to 1."""
    parts: list[SplitPart] = []
    for item in spec.split(","):
        name, sep, raw = item.strip().partition("=")
        if not sep or not name:
            raise EditError(f"--split {spec!r}: {item.strip()!r} is not NAME=FRACTION (e.g. train=0.9,val=0.1)")
        if not SPLIT_NAME.fullmatch(name) or name in (".", ".."):
            raise EditError(f"--split {spec!r}: {name!r} cannot name a dataset folder (letters, digits, '_', '.', "
                            "'-'; at most 64)")
        try:
            fraction = float(raw)
        except ValueError:
            raise EditError(f"--split {spec!r}: {raw!r} (for {name}) is not a number") from None
        if not (0 < fraction <= 1) or not math.isfinite(fraction):
            raise EditError(f"--split {spec!r}: the fraction for {name} must be above 0 and at most 1, got {raw}")
        if any(p.name == name for p in parts):
            raise EditError(f"--split {spec!r}: {name} is named twice")
        parts.append(SplitPart(name, fraction))
    total = sum(p.fraction for p in parts)
    if len(parts) < 2 or abs(total - 1) > 1e-6:
        raise EditError(f"--split {spec!r}: give two or more parts whose fractions add up to 1 (these add up to "
                        f"{total:g})")
    return tuple(parts)


def _shares(count: int, parts: Sequence[SplitPart]) -> list[int]:
    """``count`` divided by the fractions (largest remainder: each part gets floor or ceil of its share)."""
    exact = [count * p.fraction for p in parts]
    shares = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(parts)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[:count - sum(shares)]:
        shares[i] += 1
    return shares


def _rank(seed: int, episode: SourceEpisode) -> bytes:
    return hashlib.sha256(f"demoforge-split:{seed}:{episode.identity}".encode()).digest()


def allocate_split(episodes: Sequence[SourceEpisode], parts: Sequence[SplitPart], seed: int,
                   stratify: str | None = None) -> dict[str, list[int]]:
    """Episode indices of each part, each in dataset order. Deterministic: episodes are ordered by a hash of
    the seed and their identity (the store and staging episode: stable across edits), then cut by the shares;
    with ``stratify="task"`` each task is cut on its own, so every part has each task in proportion."""
    groups: dict[str, list[SourceEpisode]] = {}
    for e in episodes:
        groups.setdefault(e.task if stratify == "task" else "", []).append(e)
    out: dict[str, list[int]] = {p.name: [] for p in parts}
    for members in groups.values():
        ordered = sorted(members, key=lambda e: _rank(seed, e))
        start = 0
        for part, share in zip(parts, _shares(len(ordered), parts)):
            out[part.name] += [e.index for e in ordered[start:start + share]]
            start += share
    empty = [name for name, members in out.items() if not members]
    if empty:
        raise EditError(f"--split: part {', '.join(empty)} would hold no episode ({len(episodes)} episode(s) to "
                        "split" + (", by task" if stratify else "") + "); use fewer parts or larger fractions; "
                        "nothing was written")
    return {name: sorted(members) for name, members in out.items()}
