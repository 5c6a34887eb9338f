"""``demoforge eval``: a policy's success in a demoforge task, measured by running it as a job's driver.

An evaluation is a job whose every attempt a policy drives alone (stages/control.py) with one attempt per
episode: the rollouts are recorded in a store like any other (kept with ``--store``; a temporary one
otherwise), policy failures are committed as data, and the report is read back from the store's records.
Each of the N episodes runs once: one whose attempt ended by an error (the policy raised, exited, hung past
its time limit or returned no usable action; or the env failed) is a failed episode with its reason, never
replaced, so an evaluation of a broken policy ends after N episodes like any other.
So every task and executor a job runs on is an evaluator, including tasks LeRobot has no env for, and each
frame still carries the expert's label and phase: *reach* says how far along the expert's phases the policy
got (for each phase, the share of episodes that got at least that far, the phases in the order of the task's
segment vocabulary).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from demoforge.pipeline.job import JobSpec
from demoforge.pipeline.runner import JobRunner, JobStats
from demoforge.pipeline.workers.config import ExecutorConfig
from demoforge.stages.control import DEFAULT_POLICY_TIMEOUT_S, ControlSpec
from demoforge.stages.settings import VideoSettings
from demoforge.storage.catalog import READABLE_STATES
from demoforge.storage.store import open_store


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate (sound at 0 and n successes, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class EvalEpisode:
    episode_index: int
    seed: int
    success: bool
    length: int
    outcome: str  # "success", the terminal reason, or "error: ..." for an attempt that raised
    phases: tuple[str, ...]  # the expert's phases in the order the episode visited them


@dataclass(frozen=True)
class EvalReport:
    task: str
    driver: str
    seed: int
    episodes: tuple[EvalEpisode, ...]
    phase_names: tuple[str, ...]  # the task's segment vocabulary, in the expert's order
    store: str | None = None  # where the rollouts are kept (None: not kept)
    elapsed_s: float = 0.0
    reach: Mapping[str, float] = field(default_factory=dict)

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def success_rate(self) -> float:
        return self.successes / len(self.episodes) if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, len(self.episodes))

    @property
    def errors(self) -> dict[str, int]:
        """The episodes that ended by an error, by reason (most frequent first)."""
        counts: dict[str, int] = {}
        for e in self.episodes:
            if e.outcome.startswith("error"):
                counts[e.outcome] = counts.get(e.outcome, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    @property
    def mean_length(self) -> float:
        return sum(e.length for e in self.episodes) / len(self.episodes) if self.episodes else 0.0

    def to_json(self) -> dict[str, Any]:
        low, high = self.interval
        return {"task": self.task, "driver": self.driver, "seed": self.seed, "episodes": len(self.episodes),
                "successes": self.successes, "success_rate": self.success_rate, "ci95": [low, high],
                "mean_length": self.mean_length, "reach": dict(self.reach), "store": self.store,
                "errors": sum(self.errors.values()),
                "elapsed_s": self.elapsed_s, "per_episode": [asdict(e) for e in self.episodes]}


def evaluate(task: str, driver: str, episodes: int, *, seed: int = 0, task_options: Mapping[str, Any] | None = None,
             executor: ExecutorConfig | None = None, store: Path | None = None,
             on_progress: Callable[[JobStats], None] | None = None, on_event: Callable[[str], None] | None = None,
             video: VideoSettings | None = None,
             policy_timeout_s: float | None = DEFAULT_POLICY_TIMEOUT_S) -> EvalReport:
    """Run ``episodes`` seeded rollouts of ``driver`` in ``task`` and report them (see the module's docstring).
    ``store``: keep the rollouts there (a store of the same evaluation resumes); None: a temporary store.
    ``policy_timeout_s``: how long one policy call may take before its episode fails (None: no limit)."""
    executor = executor or ExecutorConfig(workers=1)
    spec = JobSpec(task=task, episodes=episodes, task_options=dict(task_options or {}), seed=seed, max_attempts=1,
                   workers=executor.workers if executor.kind == "thread" else 1,
                   video=video or VideoSettings(codec="h264"),
                   control=ControlSpec(driver=driver, policy_timeout_s=policy_timeout_s), max_consecutive_abandoned=0,
                   step_timeout_s=_step_timeout(policy_timeout_s))
    with tempfile.TemporaryDirectory(prefix="demoforge-eval-") as scratch:
        folder = Path(store) if store is not None else Path(scratch) / "store"
        runner = JobRunner(spec, folder, on_progress, executor=executor, on_event=on_event, fixed_episodes=True)
        report = anyio.run(runner.run)
        return _read(folder, runner, spec, str(store) if store is not None else None, report.elapsed_s)


def _step_timeout(policy_timeout_s: float | None) -> float | None:
    """The env watchdog's limit: above the policy's, so a slow policy is named as such (an env step runs within
    the same limit); none when the policy has none (a policy slower than a minute a call, on a CPU)."""
    if policy_timeout_s is None:
        return None
    return min(86_400.0, max(JobSpec.step_timeout_s or 60.0, 2 * policy_timeout_s))


def _read(folder: Path, runner: JobRunner, spec: JobSpec, kept: str | None, elapsed_s: float) -> EvalReport:
    names = tuple(runner.info.segment_names)
    rows: dict[int, EvalEpisode] = {}
    with open_store(folder) as view:
        for row in view.attempts():
            record = row.record or {}
            if row.state in READABLE_STATES:
                outcome = "success" if record.get("success") else str(record.get("terminal_reason"))
            elif row.terminal_reason == "error":
                outcome = f"error: {row.reason}"
            else:
                continue  # interrupted: not an outcome of the policy
            phases = tuple(s["name"] for s in record.get("segments") or ())
            rows[row.episode_index] = EvalEpisode(row.episode_index, row.seed, bool(record.get("success")),
                                                  int(record.get("length") or row.frames or 0), outcome, phases)
    episodes = tuple(rows[i] for i in sorted(rows))
    # How far each episode got: the furthest of the expert's phases (in its vocabulary's order) it saw.
    furthest = [max((names.index(p) for p in e.phases if p in names), default=-1) for e in episodes]
    reach = {name: sum(f >= i for f in furthest) / len(episodes) if episodes else 0.0
             for i, name in enumerate(names)}
    return EvalReport(task=spec.task, driver=str(spec.control.driver if spec.control else ""), seed=spec.seed,
                      episodes=episodes, phase_names=names, store=kept, elapsed_s=elapsed_s, reach=reach)
