"""``demoforge replay`` over many episodes: selection (``--episodes``, ``--sample``), worker processes and the
report a person or a CI job acts on."""

from __future__ import annotations

import hashlib
import multiprocessing
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demoforge.pipeline.replay import (
    DIVERGED,
    ERROR,
    REPRODUCED,
    EnvCache,
    EpisodeVerdict,
    ReplaySettings,
    depth_summary,
    replay_episode,
)
from demoforge.storage.episode_source import EpisodeRef, EpisodeSource, EpisodeSourceError, open_episode_source
from demoforge.storage.episode_spec import EpisodeSpecError, parse_episode_ranges
from demoforge.storage.provenance import library_versions
from demoforge.storage.scheduling import reset_process_priority

EXIT_REPRODUCED, EXIT_DIVERGED, EXIT_CANNOT_RUN = 0, 1, 2
SAMPLE_SALT = b"demoforge-replay-sample"


class ReplayInputError(ValueError):
    """The replay cannot run: unreadable input, an unknown task or plugin, a bad selection."""


# ------------------------------------------------------------------------------------------- selection
def parse_episode_spec(spec: str) -> Callable[[int], bool]:
    """``"0-9,12,20-"``: episode numbers, inclusive ranges, an open end. Refuses anything else."""
    try:
        parts = parse_episode_ranges(spec, "--episodes")
    except EpisodeSpecError as exc:
        raise ReplayInputError(str(exc)) from None
    return lambda n: any(n in part for part in parts)


def sample_episodes(refs: Sequence[EpisodeRef], n: int) -> list[EpisodeRef]:
    """``n`` episodes chosen by a fixed hash of their number: the same input always gives the same sample,
    and a dataset that grows keeps every earlier pick that still ranks among the first ``n``."""
    def rank(ref: EpisodeRef) -> bytes:
        return hashlib.blake2b(str(ref.number).encode(), digest_size=8, key=SAMPLE_SALT).digest()

    return sorted(sorted(refs, key=rank)[:n], key=lambda r: r.number)


def select_episodes(refs: Sequence[EpisodeRef], spec: str | None, sample: int | None) -> list[EpisodeRef]:
    chosen = list(refs)
    if spec is not None:
        wanted = parse_episode_spec(spec)
        chosen = [r for r in chosen if wanted(r.number)]
    if sample is not None:
        if sample < 1:
            raise ReplayInputError(f"--sample must be at least 1, got {sample}")
        chosen = sample_episodes(chosen, sample)
    return chosen


# --------------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class ReplayReport:
    source: str
    kind: str
    task: str
    settings: dict[str, Any]
    episodes: list[EpisodeVerdict]
    running_versions: dict[str, str]
    elapsed_s: float = 0.0
    available: int = 0  # episodes in the input before selection
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        counts = Counter(v.verdict for v in self.episodes)
        return {k: counts.get(k, 0) for k in (REPRODUCED, DIVERGED, ERROR)}

    @property
    def exit_code(self) -> int:
        counts = self.counts()
        if counts[ERROR]:
            return EXIT_CANNOT_RUN
        return EXIT_DIVERGED if counts[DIVERGED] else EXIT_REPRODUCED

    def version_differences(self) -> list[str]:
        return sorted({d for v in self.episodes for d in v.version_differences})

    def unrecorded_versions(self) -> int:
        return sum(1 for v in self.episodes if v.verdict != ERROR and v.versions is None)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "task": self.task, "settings": self.settings,
                "available": self.available, "selected": len(self.episodes), "summary": self.counts(),
                "exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3),
                "versions": {"running": self.running_versions, "differences": self.version_differences(),
                             "episodes_without_recorded_versions": self.unrecorded_versions()},
                "notes": self.notes, "episodes": [v.to_json() for v in self.episodes]}


# -------------------------------------------------------------------------------------------- workers
_worker_state: dict[str, Any] = {}


def _worker_replay(path: str, ref: EpisodeRef, settings: ReplaySettings) -> EpisodeVerdict:
    """Runs in a worker process: the source and the envs are opened once per process and reused."""
    if _worker_state.get("path") != path:
        _worker_state["path"] = path
        _worker_state["source"] = open_episode_source(Path(path))
        _worker_state["envs"] = EnvCache()
    return replay_episode(_worker_state["source"], ref, settings, _worker_state["envs"])


def _tolerance_text(settings: Mapping[str, Any]) -> str:
    """One tolerance, or each task's when the episodes' tasks check with different ones."""
    per_task = settings.get("tolerances") or {}
    distinct = {(t["atol"], t["rtol"]) for t in per_task.values()}
    if len(distinct) <= 1:
        return f"atol {settings['atol']:g}, rtol {settings['rtol']:g}"
    return "; ".join(f"{task}: atol {t['atol']:g}, rtol {t['rtol']:g}" for task, t in per_task.items())


def _check_tasks(source: EpisodeSource, refs: Sequence[EpisodeRef]) -> None:
    """Refuse before starting when a task is not registered here (a plugin module not named), or now
    describes other features than the input records."""
    from demoforge.pipeline.tasks.registry import (
        TaskDefinitionError,
        TaskOptionError,
        TaskPluginError,
        UnknownTaskError,
        get_task,
    )

    for task in sorted({r.task for r in refs}):
        try:
            entry = get_task(task)
        except (UnknownTaskError, TaskPluginError) as exc:
            raise ReplayInputError(f"{source.path} was generated with task {task!r}, which cannot be loaded here: "
                                   f"{exc}. A plugin task needs its module named in DEMOFORGE_TASK_MODULES (or its "
                                   "package installed)") from None
        except ImportError as exc:  # a built-in task's simulator is not installed
            raise ReplayInputError(f"cannot load task {task!r} of {source.path}: {exc}") from None
        if source.kind != "store":
            continue  # a dataset's options are per episode; checked when each is built
        try:
            info = entry.info(source.schema.task_options)
        except (TaskOptionError, TaskDefinitionError) as exc:
            raise ReplayInputError(f"task {task!r} refuses the store's options: {exc}") from None
        recorded = source.schema
        now = ({k: tuple(v) for k, v in info.state_shapes.items()}, tuple(info.action_shape),
               tuple((c.name, c.height, c.width) for c in info.cameras))
        then = (dict(recorded.state_shapes), tuple(recorded.action_shape), tuple(recorded.cameras))
        if now != then:
            raise ReplayInputError(f"task {task!r} now records state {now[0]}, action {now[1]}, cameras {now[2]}; "
                                   f"{source.path} recorded state {then[0]}, action {then[1]}, cameras {then[2]}")


def run_replay(path: Path | str, *, episodes: str | None = None, sample: int | None = None,
               settings: ReplaySettings = ReplaySettings(), workers: int = 1,
               progress: Callable[[int, int, EpisodeVerdict], None] | None = None) -> ReplayReport:
    """Replay the selected episodes of a store or dataset; ``progress(done, total, verdict)`` after each."""
    import time

    started = time.monotonic()
    if workers < 1:
        raise ReplayInputError(f"--workers must be at least 1, got {workers}")
    try:
        source = open_episode_source(path)
    except EpisodeSourceError as exc:
        raise ReplayInputError(str(exc)) from None
    try:
        try:
            available = source.episodes()
        except EpisodeSourceError as exc:
            raise ReplayInputError(str(exc)) from None
        pruned = pruned_episodes(source)
        if pruned and not available:
            raise ReplayInputError(
                f"{path}: its {pruned} committed episode(s) were pruned (their staged data deleted after "
                "`demoforge export`), so the store holds nothing to replay; replay the dataset they were exported "
                "to: demoforge replay DATASET")
        chosen = select_episodes(available, episodes, sample)
        _check_tasks(source, chosen)
        # Each episode is checked with its own task's tolerance (a dataset may hold several jobs' tasks).
        tolerances = {t: settings.tolerance(t) for t in sorted({r.task for r in chosen} or {source.schema.task})}
        tolerance = settings.tolerance(source.schema.task)
        threshold = settings.psnr_threshold(str(source.schema.video.get("codec")))
        depth = source.schema.depth_video
        described = {"atol": tolerance.atol, "rtol": tolerance.rtol,
                     "tolerances": {t: {"atol": tol.atol, "rtol": tol.rtol} for t, tol in tolerances.items()},
                     "images": settings.images,
                     "min_psnr_db": threshold if settings.images else None,
                     "codec": source.schema.video.get("codec"),
                     "depth": {"cameras": list(source.schema.depth_cameras), "compared": "exact",
                               "codec": depth.codec, "pix_fmt": depth.pix_fmt}
                     if settings.images and depth is not None and source.schema.depth_cameras else None,
                     "workers": workers, "episodes": episodes, "sample": sample}
        if workers == 1 or len(chosen) <= 1:
            verdicts = _run_here(source, chosen, settings, progress)
        else:
            verdicts = _run_pool(str(path), chosen, settings, workers, progress)
    finally:
        source.close()
    notes = []
    if not chosen:
        notes.append("no episode selected" if available else "the input holds no committed episode")
    if pruned:
        notes.append(f"{pruned} episode(s) of the store were pruned after export and are not replayed here; "
                     "replay them from the dataset: demoforge replay DATASET")
    return ReplayReport(source=str(path), kind=source.kind, task=source.schema.task, settings=described,
                        episodes=sorted(verdicts, key=lambda v: v.number), running_versions=library_versions(),
                        elapsed_s=time.monotonic() - started, available=len(available), notes=notes)


def pruned_episodes(source: EpisodeSource) -> int:
    """How many of a store's episodes were pruned (staged data deleted after export; the dataset holds them),
    which a store source leaves out; 0 for a dataset."""
    if source.kind != "store":
        return 0
    from demoforge.storage.catalog import Catalog

    catalog = Catalog.open_read_only(Path(source.path))
    try:
        return catalog.pruned_count()
    finally:
        catalog.close()


def _run_here(source: EpisodeSource, refs: Sequence[EpisodeRef], settings: ReplaySettings,
              progress: Callable[[int, int, EpisodeVerdict], None] | None) -> list[EpisodeVerdict]:
    envs = EnvCache()
    out: list[EpisodeVerdict] = []
    try:
        for ref in refs:
            out.append(replay_episode(source, ref, settings, envs))
            if progress is not None:
                progress(len(out), len(refs), out[-1])
    finally:
        envs.close()
    return out


def _run_pool(path: str, refs: Sequence[EpisodeRef], settings: ReplaySettings, workers: int,
              progress: Callable[[int, int, EpisodeVerdict], None] | None) -> list[EpisodeVerdict]:
    """Episodes in ``workers`` spawned processes (MuJoCo's GL contexts and threads do not survive a fork)."""
    out: list[EpisodeVerdict] = []
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(refs)), mp_context=context,
                               initializer=reset_process_priority)
    try:
        pending: dict[Future[EpisodeVerdict], EpisodeRef] = {
            pool.submit(_worker_replay, path, ref, settings): ref for ref in refs}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                ref = pending.pop(future)
                try:
                    verdict = future.result()
                except BrokenProcessPool as exc:
                    verdict = EpisodeVerdict(number=ref.number, label=ref.label, seed=ref.seed, attempt=ref.attempt,
                                             frames=ref.frames, verdict=ERROR,
                                             error=f"{ref.label}: the worker process died ({exc})")
                except Exception as exc:
                    verdict = EpisodeVerdict(number=ref.number, label=ref.label, seed=ref.seed, attempt=ref.attempt,
                                             frames=ref.frames, verdict=ERROR,
                                             error=f"{ref.label}: {type(exc).__name__}: {exc}")
                out.append(verdict)
                if progress is not None:
                    progress(len(out), len(refs), verdict)
    except BaseException:  # Ctrl-C or an error here: drop the queued episodes rather than wait for them
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return out


# ----------------------------------------------------------------------------------------------- text
def _where(verdict: EpisodeVerdict) -> str:
    d = verdict.divergence
    if d is None:
        return "-"
    segment = f"{d.segment} step {d.segment_step}" if d.segment is not None else "?"
    return f"frame {d.frame} ({segment}), {d.kind}: {d.feature}"


def _error_text(verdict: EpisodeVerdict) -> str:
    d = verdict.divergence
    if d is None or d.error is None:
        return "-"
    if d.kind == "image":
        return f"{d.error:.1f} dB"
    if d.kind == "depth":
        return f"{d.pixels} px, max {d.error:.3g} m"
    return f"{d.error:.3g}"


def camera_text(verdict: EpisodeVerdict) -> str:
    """Per camera over the episode: an RGB camera's lowest PSNR, a depth camera's ``exact`` or frames differing."""
    parts = [f"{camera} {value:.1f} dB" for camera, value in sorted(verdict.min_psnr_db.items())]
    parts += [f"{camera} {depth_summary(n, verdict.frames)}"
              for camera, n in sorted(verdict.depth_differing_frames.items())]
    return ", ".join(parts) or "-"


def print_report(report: ReplayReport, console: Any) -> None:
    """The summary table, one line per problem and the version note (a few lines, no traceback)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"replay of {report.source} ({report.kind}, task {report.task})")
    with_images = bool(report.settings["images"])
    columns = ["episode", "seed", "frames", "verdict", "first divergence", "error", "max |diff| (all frames)"]
    for col in columns + (["cameras (lowest PSNR; depth)"] if with_images else []):
        table.add_column(col, overflow="fold")
    style = {REPRODUCED: "green", DIVERGED: "red", ERROR: "yellow"}
    for v in report.episodes:
        worst = max(v.max_errors.values(), default=None)
        row: list[str | Text] = [str(v.number), str(v.seed), str(v.frames), Text(v.verdict, style=style[v.verdict]),
                                 _where(v), _error_text(v), "-" if worst is None else f"{worst:.3g}"]
        table.add_row(*row, *([camera_text(v)] if with_images else []))
    if report.episodes:
        console.print(table)
    for v in report.episodes:
        if v.verdict == DIVERGED and v.divergence is not None:
            d = v.divergence
            console.print(Text.assemble(("DIVERGED", "red"), f" {v.label}: frame {d.frame} (segment {d.segment!r}, "
                                        f"step {d.segment_step} of it): {d.detail}; {v.mismatched_frames} of "
                                        f"{v.frames} frames differ"), highlight=False)
        elif v.verdict == ERROR:
            console.print(Text.assemble(("CANNOT REPLAY", "yellow"), f" {v.error}"), highlight=False)
    s = report.settings
    counts = report.counts()
    images = f"; images: PSNR >= {s['min_psnr_db']:g} dB ({s['codec']})" if s["images"] else ""
    if s.get("depth"):
        depth = s["depth"]
        images += (f", depth {', '.join(depth['cameras'])}: stored codes exactly (lossless {depth['codec']} "
                   f"{depth['pix_fmt']})")
    console.print(f"{len(report.episodes)} of {report.available} episode(s) selected, {report.elapsed_s:.1f} s: "
                  f"{counts[REPRODUCED]} reproduced, {counts[DIVERGED]} diverged, {counts[ERROR]} could not be "
                  f"replayed ({_tolerance_text(s)}{images})", highlight=False)
    for note in report.notes:
        console.print(note, highlight=False)
    differences = report.version_differences()
    if differences:
        console.print("recorded with other library versions than this process runs: " + "; ".join(differences)
                      + " (floating-point results may legitimately differ; see docs/reliability.md)", highlight=False)
    missing = report.unrecorded_versions()
    if missing:
        console.print(f"{missing} episode(s) do not record the library versions they were generated with",
                      highlight=False)
