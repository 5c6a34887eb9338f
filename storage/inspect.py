"""``demoforge inspect``: episodes, outcomes and per-segment statistics of a store or an exported dataset,
and optionally a picture: per-episode segment timelines above a contact sheet of camera frames taken at
segment boundaries (a depth camera's frame, colour-mapped, next to the RGB frame of the same step). Drawn
with Pillow (already a dependency through lerobot) to keep plotting libraries out of the install."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from demoforge.storage.paths import CATALOG_FILE
from demoforge.storage.depth import COLOUR_PERCENTILES, colourise, decode_codes, dequantize
from demoforge.storage.episode_source import ReplayDatasetSource
from demoforge.storage.lerobot.episode_filter import multiply_provenance
from demoforge.storage.lerobot.format import INFO, SIDECAR, read_sidecar
from demoforge.storage.store import open_store
from demoforge.storage.schema import READABLE_STATES, AttemptState
from demoforge.storage.video import decode_indices


@dataclass
class Inspection:
    source: str
    kind: str  # "store" or "dataset"
    episodes: list[dict[str, Any]] = field(default_factory=list)  # committed/exported episode records
    # discarded attempts' records (stores) and failures kept as data (generate --keep-failures)
    failed: list[dict[str, Any]] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    frames: dict[str, list[np.ndarray]] = field(default_factory=dict)  # "episode:segment" -> boundary frames
    # a store's generation: (successes, attempts) from its catalog; None for a dataset (its attempts are not in it)
    attempts: tuple[int, int] | None = None

    def segment_stats(self) -> dict[str, dict[str, Any]]:
        lengths: dict[str, list[int]] = defaultdict(list)
        failures: dict[str, Counter[str]] = defaultdict(Counter)
        for record in self.episodes + self.failed:
            for s in record.get("segments", []):
                if record.get("success"):
                    lengths[s["name"]].append(int(s["end_step"]) - int(s["start_step"]))
                if not s.get("success", True) and s.get("failure_reason"):
                    failures[s["name"]][s["failure_reason"]] += 1
        out = {}
        for name in sorted(set(lengths) | set(failures)):
            values = np.array(lengths.get(name, []) or [0])
            out[name] = {"count": len(lengths.get(name, [])), "min": int(values.min()), "median": float(np.median(values)),
                         "mean": round(float(values.mean()), 2), "max": int(values.max()),
                         "failures": dict(failures.get(name, {}))}
        return out

    def to_json(self) -> dict[str, Any]:
        lengths = [int(e["length"]) for e in self.episodes]
        return {"source": self.source, "kind": self.kind, "episodes": len(self.episodes),
                "frames": int(sum(lengths)), "outcomes": self.outcomes,
                "episode_length": {"min": min(lengths, default=0), "max": max(lengths, default=0),
                                   "mean": round(float(np.mean(lengths)), 2) if lengths else 0},
                "segments": self.segment_stats(), "randomization": self.randomization(),
                **({"generation": generation} if (generation := self.generation()) is not None else {})}

    def generation(self) -> dict[str, Any] | None:
        """A ``demoforge multiply`` job's generation (None when no episode was multiplied): its success rate
        from the store's attempts (attempts per success), and how many generated segments each source episode
        gave."""
        sources: Counter[int] = Counter()
        multiplied = 0
        for record in self.episodes:
            origins = multiply_provenance(record)
            multiplied += bool(origins)
            sources.update(int(o["source_episode"]) for o in origins if isinstance(o.get("source_episode"), int))
        if not multiplied:
            return None
        out: dict[str, Any] = {"multiplied_episodes": multiplied,
                               "source_episodes": {str(k): v for k, v in sorted(sources.items())}}
        if self.attempts is not None:
            successes, attempts = self.attempts
            out.update(successes=successes, attempts=attempts,
                       attempts_per_success=round(attempts / successes, 3) if successes else None)
        return out

    def randomization(self) -> list[dict[str, Any]]:
        """Each randomized episode's drawn values (its record's ``randomization``: axes, offsets, scales), by
        episode: what ``describe`` counts and points to."""
        return [{"episode": _episode_key(record), "seed": record.get("seed"), "values": record["randomization"]}
                for record in self.episodes if record.get("randomization")]


def _episode_key(record: dict[str, Any]) -> Any:
    """The episode's number where it is shown: its dataset index in a dataset, its store index in a store."""
    return record.get("dataset_episode_index", record.get("episode_index"))


def inspect_path(path: Path | str, *, with_frames: bool = False, max_episodes: int = 8) -> Inspection:
    path = Path(path)
    if (path / CATALOG_FILE).exists():
        return _inspect_store(path, with_frames, max_episodes)
    if (path / INFO).exists():
        return _inspect_dataset(path, with_frames, max_episodes)
    raise FileNotFoundError(f"{path} is neither a demoforge store ({CATALOG_FILE}) nor a LeRobot dataset ({INFO})")


def _inspect_store(path: Path, with_frames: bool, max_episodes: int) -> Inspection:
    with open_store(path) as store:
        rows = store.attempts()
        good = [r for r in rows if r.state in READABLE_STATES and r.record and not r.kept_failure]
        result = Inspection(str(path), "store", episodes=[{**r.record, "length": r.frames} for r in good if r.record])
        result.outcomes = dict(Counter(_store_outcome(r) for r in rows))
        result.failed = [r.record for r in rows if (r.state == AttemptState.DISCARDED or r.kept_failure) and r.record]
        result.attempts = _generation_attempts(rows)
        fingerprint, staging = store.fingerprint, store.staging
        if with_frames and fingerprint is not None and staging is not None and fingerprint.cameras:
            rgb = next((c.name for c in fingerprint.cameras if not c.is_depth), None)
            depth = next((c.name for c in fingerprint.cameras if c.is_depth), None)
            pruned = store.pruned_ids()  # staged data deleted after export: no frames to show
            for r in [r for r in good if r.episode_id not in pruned][:max_episodes]:
                video = staging.read_episode(r.episode_id, r.frames or 0, r.video_bytes).video
                record = r.record or {}
                steps = _boundary_steps(record)
                frames = decode_indices(video[rgb], steps) if rgb else {}
                depths = {}
                if depth and fingerprint.depth_video is not None:
                    depths = {i: dequantize(codes, fingerprint.depth_video)
                              for i, codes in decode_codes(video[depth], steps).items()}
                _add_boundary_frames(result, record, frames, depths)
    return result


def _generation_attempts(rows: list[Any]) -> tuple[int, int]:
    """(successes, attempts): the job's committed episodes (exported or quarantined since included), and those
    plus every failed attempt that counted (discarded or kept as data; one a kill interrupted is retried, not
    counted)."""
    good = sum(1 for r in rows if not r.kept_failure and r.state in (*READABLE_STATES, AttemptState.QUARANTINED))
    failed = sum(1 for r in rows if r.kept_failure or (r.state == AttemptState.DISCARDED and r.counted))
    return good, good + failed


def _store_outcome(row: Any) -> str:
    """An attempt's line in ``outcomes``: its state, with the reason for a discarded or kept failure."""
    if row.kept_failure:
        return f"kept_failure:{row.terminal_reason}"
    if row.state == AttemptState.DISCARDED:
        return f"discarded:{row.terminal_reason}"
    return str(row.state)


def _boundary_steps(record: dict[str, Any]) -> list[int]:
    """The first and last frame of every segment: what the contact sheet shows."""
    return [step for s in record.get("segments", []) for step in (int(s["start_step"]), int(s["end_step"]) - 1)]


def _inspect_dataset(path: Path, with_frames: bool, max_episodes: int) -> Inspection:
    if not (path / SIDECAR).exists():
        raise FileNotFoundError(f"{path} has no {SIDECAR}: not a demoforge export, so it has no segment records")
    records = read_sidecar(path)
    kept = [r for r in records if r.get("kept_failure")]
    records = [r for r in records if not r.get("kept_failure")]
    result = Inspection(str(path), "dataset", episodes=records, failed=kept, outcomes={
        "exported": len(records), **Counter(f"kept_failure:{r.get('terminal_reason')}" for r in kept)})
    if with_frames and records:
        # The exported videos decoded here as LeRobot decodes them (the same bytes as staged: export remuxes),
        # without importing LeRobot and torch (about 8 s of a plot's 10).
        source = ReplayDatasetSource(path)
        try:
            schema = source.schema
            key = next((c[0] for c in schema.cameras if c[0] not in schema.depth_cameras), None)
            depth_key = next(iter(schema.depth_cameras), None) if schema.depth_video is not None else None
            if key or depth_key:
                refs = {ref.number: ref for ref in source.episodes()}
                for record in records[:max_episodes]:
                    episode = source.load(refs[int(record["dataset_episode_index"])])
                    steps = _boundary_steps(record)
                    frames, depths = {}, {}
                    if key:
                        decoded = source.camera_frames(episode, key)
                        frames = {step: decoded[step] for step in steps if step < len(decoded)}
                    if depth_key and schema.depth_video is not None:
                        codes = source.depth_codes(episode, depth_key)
                        depths = {step: dequantize(codes[step], schema.depth_video) for step in steps
                                  if step < len(codes)}
                    _add_boundary_frames(result, record, frames, depths)
        finally:
            source.close()
    return result


def _add_boundary_frames(result: Inspection, record: dict[str, Any], frames: dict[int, np.ndarray],
                         depths: dict[int, np.ndarray] | None = None) -> None:
    """Each segment's first and last frame; a depth frame (metres, colour-mapped over the episode's boundary
    frames: near is yellow, far is blue) follows the RGB frame of the same step."""
    key = _episode_key(record)
    depths = depths or {}
    near_far = _depth_range(list(depths.values()))
    for s in record.get("segments", []):
        picks: list[np.ndarray | None] = []
        for step in (int(s["start_step"]), int(s["end_step"]) - 1):
            picks.append(frames.get(step))
            if step in depths:
                picks.append(colourise(depths[step], *near_far))
        result.frames[f"{key}:{s['name']}"] = [p for p in picks if p is not None]


def _depth_range(depths: list[np.ndarray]) -> tuple[float | None, float | None]:
    """Near and far for the colour map: robust percentiles, so a far background does not flatten the scene."""
    if not depths:
        return None, None
    values = np.concatenate([d.ravel() for d in depths])
    near, far = np.percentile(values, COLOUR_PERCENTILES)
    return float(near), float(far)


# ------------------------------------------------------------------------------------------- picture
_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
            (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


def draw(result: Inspection, out: Path | str, max_episodes: int = 8) -> Path:
    from PIL import Image, ImageDraw

    episodes = result.episodes[:max_episodes]
    names = list(dict.fromkeys(_base_name(s["name"]) for e in episodes for s in e.get("segments", [])))
    colors = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
    width, bar_h, margin = 1200, 22, 110
    longest = max((int(e["length"]) for e in episodes), default=1)
    thumbs = [(k, f) for k, fs in result.frames.items() for f in fs]
    thumb = 96
    per_row = (width - 20) // (thumb + 6)
    sheet_rows = -(-len(thumbs) // per_row) if thumbs else 0
    height = 40 + len(episodes) * (bar_h + 6) + 30 + 20 * (-(-len(names) // 6)) + sheet_rows * (thumb + 22) + 20
    image = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(image)
    pen.text((10, 10), f"{result.kind} {result.source}: {len(result.episodes)} episodes (showing {len(episodes)})",
             fill="black")
    y = 40
    scale = (width - margin - 20) / longest
    for e in episodes:
        label = f"ep {e.get('dataset_episode_index', e.get('episode_index'))}"
        pen.text((10, y + 5), label, fill="black")
        for s in e.get("segments", []):
            x0 = margin + int(s["start_step"]) * scale
            x1 = margin + int(s["end_step"]) * scale
            pen.rectangle([x0, y, max(x1 - 1, x0 + 1), y + bar_h], fill=colors[_base_name(s["name"])],
                          outline="white")
        y += bar_h + 6
    y += 10
    for i, name in enumerate(names):
        x = 10 + (i % 6) * 195
        if i and i % 6 == 0:
            y += 20
        pen.rectangle([x, y, x + 14, y + 14], fill=colors[name])
        pen.text((x + 20, y + 2), name, fill="black")
    y += 30
    for i, (key, frame) in enumerate(thumbs):
        x = 10 + (i % per_row) * (thumb + 6)
        row_y = y + (i // per_row) * (thumb + 22)
        image.paste(Image.fromarray(frame).resize((thumb, thumb)), (x, row_y))
        pen.text((x, row_y + thumb + 2), key[:16], fill="black")
    out = Path(out)
    image.save(out)
    return out


def _base_name(name: str) -> str:
    """'reach_2' and 'reach_0' share a colour: strip a trailing cycle number."""
    head, _, tail = name.rpartition("_")
    return head if head and tail.isdigit() else name


def _randomization_lines(result: Inspection) -> list[str]:
    """One line per set of randomized axes (the drawn values are in each episode's record, ``--json``)."""
    counts: dict[str, int] = {}
    for record in result.episodes:
        drawn = record.get("randomization")
        if drawn:
            key = ", ".join(drawn.get("axes", [])) or "nothing"
            counts[key] = counts.get(key, 0) + 1
    return [f"randomized: {axes} ({n} episode(s); drawn values in --json)" for axes, n in sorted(counts.items())]


_SHOWN_SOURCES = 10  # source episodes named on the generation line; --json has them all


def _generation_lines(generation: dict[str, Any] | None) -> list[str]:
    """A multiply job's line: its generation success rate (a store) and the source episodes it drew on."""
    if generation is None:
        return []
    sources = generation["source_episodes"]
    shown = ", ".join(f"{k} x{v}" for k, v in list(sources.items())[:_SHOWN_SOURCES])
    more = f" and {len(sources) - _SHOWN_SOURCES} more (--json)" if len(sources) > _SHOWN_SOURCES else ""
    drawn = f"segments from {len(sources)} source episode(s): {shown}{more}"
    if "attempts" not in generation:
        return [f"multiplied: {generation['multiplied_episodes']} episode(s); {drawn} (the generation success rate "
                "is in the store's attempts: inspect the store)"]
    successes, attempts = generation["successes"], generation["attempts"]
    rate = f"{attempts / successes:.2f} attempts per success" if successes else "no success yet"
    return [f"generation (multiply): {successes}/{attempts} attempts succeeded ({rate}); {drawn}"]


def describe(result: Inspection) -> str:
    data = result.to_json()
    lines = [f"{data['kind']} {data['source']}: {data['episodes']} episodes, {data['frames']} frames; "
             f"episode length min/mean/max {data['episode_length']['min']}/{data['episode_length']['mean']}/"
             f"{data['episode_length']['max']}",
             "outcomes: " + (", ".join(f"{k}={v}" for k, v in sorted(data["outcomes"].items())) or "none"),
             *_randomization_lines(result), *_generation_lines(data.get("generation")),
             f"{'segment':<24}{'count':>7}{'min':>6}{'median':>8}{'mean':>8}{'max':>6}  failures"]
    for name, s in data["segments"].items():
        failures = ", ".join(f"{k} x{v}" for k, v in s["failures"].items()) or "-"
        lines.append(f"{name:<24}{s['count']:>7}{s['min']:>6}{s['median']:>8.1f}{s['mean']:>8.2f}{s['max']:>6}  "
                     f"{failures}")
    return "\n".join(lines)
