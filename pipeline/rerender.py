"""``demoforge rerender``: re-simulate recorded episodes and record new observations of them.

A rerender is a job with a store, like ``generate``: the same stages, executors, resume and export. What differs
is its task: :class:`RerenderedEpisodes` wraps the recorded task's env (built with the new appearance options)
and, for job episode ``i``, plays the source episode ``i // variants`` back: the source's seed (reset and
randomization), its segments with their recorded actions, its instruction. Every recorded observation is
checked against the re-simulated one (replay's tolerances); the first that differs stops the episode, which is
reported and never written. What a frame records is the source's own state and reward (so every non-video
column is byte-identical) with the newly rendered images. Variant ``v > 0`` redraws the appearance axes of the
task's randomization from (seed, v); physics and the initial state stay the episode's own.

Only appearance may change: a task declares which of its options only change rendering
(``TaskEntry.appearance_options``); anything else, or a physics or initial-state randomization, is refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.replay import CONTROL_FEATURES, default_tolerance, difference
from demoforge.pipeline.rerender_spec import RerenderSpec
from demoforge.pipeline.tasks.randomization import APPEARANCE_AXES, RANDOMIZE, RANGES, parse_axes
from demoforge.pipeline.tasks.registry import TaskEntry, get_task
from demoforge.stages.contract import ObservationError, RecordedObservation, Segment
from demoforge.stages.segment_cursor import SegmentCursor
from demoforge.stages.task_protocol import draw_randomization, recorder_of


class RerenderInputError(ValueError):
    """The source cannot be rerendered as asked (unreadable, mixed jobs, a change that is not appearance)."""


# ---------------------------------------------------------------------------------------------- the env
class RerenderedEpisodes(gym.Wrapper):
    """The task's env playing a recorded job's episodes back (see the module docstring). The success check and the
    hold action stay the task's own: the executor finds them through the wrapper chain."""

    def __init__(self, env: gym.Env, spec: RerenderSpec, task: str) -> None:
        super().__init__(env)
        self.rerender = spec
        self.tolerance = default_tolerance(task)
        self._source: Any = None
        self._refs: list[Any] = []
        self._episode: Any = None
        self._variant = 0
        self._frame = 0

    def _open(self) -> None:
        if self._source is None:
            from demoforge.storage.episode_source import open_episode_source

            self._source = open_episode_source(self.rerender.source)
            self._refs = self._source.episodes()

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None
        super().close()

    # -- which episode
    def demo_select_episode(self, episode_index: int) -> str:
        self._open()
        position, self._variant = self.rerender.locate(episode_index)
        if not 0 <= position < len(self._refs):
            raise ValueError(f"episode {episode_index} is beyond the source's {len(self._refs)} episodes")
        self._episode = self._source.load(self._refs[position])
        return str(self._episode.ref.task)

    def demo_attempt_seed(self, episode_index: int) -> int:
        return int(self._episode.ref.seed)

    def demo_randomize(self, seed: int) -> Mapping[str, Any] | None:
        drawn = draw_randomization(self.env, seed, self._variant)
        recorded = self._episode.record.get("randomization") or {}
        for axis in set(drawn or {}) | set(recorded):
            if axis in APPEARANCE_AXES or axis in ("axes", "variant"):
                continue
            if (drawn or {}).get(axis) != recorded.get(axis):
                raise ObservationError(f"the {axis} drawn from the episode's seed differs from the recorded one: "
                                       "the task's randomization changed since it was recorded")
        return drawn

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._frame = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        observation, reward, terminated, truncated, info = self.env.step(action)
        t = self._frame - 1  # the frame whose action this was (demo_record counted it)
        recorded = self._episode.reward[t]
        why = difference("next.reward", recorded, reward, self.tolerance)
        if why is not None:
            raise ObservationError(f"the re-simulation diverged from the source at frame {t}: {why}")
        return observation, float(recorded), terminated, truncated, info

    # -- the plan: the recorded segments and actions, with the task's own plan walked in step
    def create_demo_segments(self) -> Iterator[Segment]:
        """The source's segments and actions. The task's own planner runs in step with them (each segment planned
        when the executor asks for it, each action computed before the recorded one is stepped), because a
        planner may change the env as it plans (fetch places each cycle's goal), and its validators judge each
        segment as they did when it was recorded."""
        ep = self._episode
        plan = SegmentCursor(self.env, "?")
        for seg in ep.record.get("segments", []):
            planned = plan.plan_next()
            if planned is None or planned.name != seg["name"]:
                raise ObservationError(f"the task plans {planned.name if planned else 'no more'!r} where the source "
                                       f"recorded segment {seg['name']!r}: the re-simulation diverged")
            start, end = int(seg["start_step"]), int(seg["end_step"])
            yield Segment(actions=_in_step(plan, ep.action[start:end]), name=str(seg["name"]),
                          target=seg.get("target"), instruction=seg.get("instruction"),
                          metadata=dict(seg.get("metadata") or {}), validator=planned.validator)

    def demo_record(self, observation: Any) -> RecordedObservation:
        replayed = recorder_of(self.env)(observation)
        ep, t = self._episode, self._frame
        state: dict[str, np.ndarray] = {}
        for name, values in ep.state.items():
            if name in CONTROL_FEATURES:
                continue
            if name not in replayed.state:
                raise ObservationError(f"the task no longer records {name!r}")
            why = difference(name, values[t], replayed.state[name], self.tolerance)
            if why is not None:
                raise ObservationError(f"the re-simulation diverged from the source at frame {t}: {why}")
            state[name] = values[t]
        self._frame += 1
        return RecordedObservation(state=state, images=dict(replayed.images))

    def demo_instruction(self) -> str | None:
        return self._episode.record.get("instruction")

def _in_step(plan: SegmentCursor, recorded: np.ndarray) -> Iterator[np.ndarray]:
    """The recorded actions, each after the planner computed its own for the same state (its side effects)."""
    for action in recorded:
        plan.next_action()
        yield action
    plan.next_action()  # asked once more, as the executor asks: a reactive expert notices its phase ended


def build_job_env(entry: TaskEntry, options: Mapping[str, Any], rerender: RerenderSpec | None) -> gym.Env:
    """A job's env: the task's, playing a recorded job back when the job is a rerender."""
    env = entry.build(options)
    return RerenderedEpisodes(env, rerender, entry.name) if rerender is not None else env


# --------------------------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class RerenderPlan:
    """A checked rerender: the task and options to build, and how many source episodes there are."""

    task: str
    options: Mapping[str, Any]
    sources: int
    spec: RerenderSpec


def _appearance(entry: TaskEntry, key: str) -> bool:
    return key in entry.appearance_options or (key in RANGES and key.split(".")[1] in APPEARANCE_AXES)


def plan_rerender(source: Path, overrides: Mapping[str, Any], variants: int) -> RerenderPlan:
    """Read what ``source`` recorded and check that ``overrides`` change only appearance; raises
    :class:`RerenderInputError` naming what cannot be done."""
    from demoforge.pipeline.tasks.registry import TaskOptionError, UnknownTaskError

    try:
        spec = RerenderSpec(str(Path(source).resolve()), variants)
    except ValueError as exc:
        raise RerenderInputError(str(exc)) from None
    refs, headers = _read_source(source)
    task, recorded = _one_job(source, refs, headers)
    try:
        entry = get_task(task)
    except UnknownTaskError as exc:
        raise RerenderInputError(f"cannot rebuild task {task!r}: {exc}") from None
    if _suite(entry, recorded):
        raise RerenderInputError(f"{task!r} is a suite: rerender one member task at a time")
    options = _appearance_options(entry, task, recorded, overrides, variants)
    try:
        entry.info(options)
    except (TaskOptionError, ValueError) as exc:
        raise RerenderInputError(f"{task!r} cannot be built with {dict(options)}: {exc}") from None
    return RerenderPlan(task=task, options=options, sources=len(refs), spec=spec)


def _read_source(source: Path) -> tuple[list[Any], list[Any]]:
    """The source's committed episodes and each one's header (record, task options)."""
    from demoforge.storage.episode_source import EpisodeSourceError, open_episode_source

    try:
        opened = open_episode_source(source)
    except EpisodeSourceError as exc:
        raise RerenderInputError(str(exc)) from None
    try:
        refs = opened.episodes()
        if not refs:
            raise RerenderInputError(f"{source} has no committed episodes to rerender")
        return refs, [opened.header(ref) for ref in refs]
    except EpisodeSourceError as exc:
        raise RerenderInputError(str(exc)) from None
    finally:
        opened.close()


def _one_job(source: Path, refs: list[Any], headers: list[Any]) -> tuple[str, dict[str, Any]]:
    """The one job the source's episodes come from (task, recorded options), refused unless they are one job's
    expert-driven episodes, recorded with the simulation libraries installed here."""
    jobs = {(ref.task, _key(options)) for ref, (_, options) in zip(refs, headers)}
    if len(jobs) > 1:
        raise RerenderInputError(f"{source} holds episodes of {len(jobs)} different tasks or option sets: rerender "
                                 "one job at a time (`demoforge edit --keep-where` selects one)")
    task, recorded = refs[0].task, headers[0][1]
    if recorded is None:
        raise RerenderInputError(f"{source} does not record the task options it was generated with (exported by "
                                 "an older demoforge): rerender its store, or re-export it")
    driven = [ref.number for ref, (record, _) in zip(refs, headers) if record.get("driver")]
    if driven:
        raise RerenderInputError(f"{len(driven)} episode(s) of {source} were driven by noise or a policy (first: "
                                 f"{driven[0]}): rerender replays expert-driven episodes only; select them with "
                                 "`demoforge edit --keep-where 'driver == \"expert\"'`")
    from demoforge.storage.provenance import library_versions, version_differences

    simulation = {k: v for k, v in library_versions().items() if k not in ("demoforge", "av")}  # not physics
    differences = sorted({d for record, _ in headers for d in version_differences(
        {k: v for k, v in (record.get("versions") or {}).items() if k in simulation}, simulation)})
    if differences:
        raise RerenderInputError(f"{source} was recorded with other library versions ({'; '.join(differences)}): "
                                 "a re-simulation could diverge; rerender where those versions are installed")
    return str(task), dict(recorded)


def _appearance_options(entry: TaskEntry, task: str, recorded: Mapping[str, Any], overrides: Mapping[str, Any],
                        variants: int) -> dict[str, Any]:
    """The recorded options with ``overrides`` applied, refused unless they change appearance only."""
    changed = [k for k, v in overrides.items() if k != RANDOMIZE and recorded.get(k, entry.all_defaults.get(k)) != v]
    physical = [k for k in changed if not _appearance(entry, k)]
    if physical:
        allowed = sorted(entry.appearance_options) + ["randomize.lighting.*", "randomize.colors.*",
                                                      "randomize.camera.*"]
        raise RerenderInputError(f"option {physical[0]!r} of {task!r} is not appearance (it could change the "
                                 f"physics the episodes were recorded with); rerender may change: "
                                 f"{', '.join(allowed)}")
    options = {**recorded, **{k: v for k, v in overrides.items() if k != RANDOMIZE}}
    if RANDOMIZE in overrides:
        try:
            before, added = parse_axes(str(recorded.get(RANDOMIZE, ""))), parse_axes(str(overrides[RANDOMIZE]))
        except ValueError as exc:
            raise RerenderInputError(str(exc)) from None
        physics = [a for a in added if a not in APPEARANCE_AXES and a not in before]
        if physics:
            raise RerenderInputError(f"--randomize {physics[0]}: rerender may add appearance axes only "
                                     f"({', '.join(sorted(APPEARANCE_AXES))}); {physics[0]} changes the physics")
        options[RANDOMIZE] = ",".join(dict.fromkeys(before + added))
    if variants > 1 and not (set(parse_axes(str(options.get(RANDOMIZE, "")))) & APPEARANCE_AXES):
        raise RerenderInputError("--variants needs an appearance axis to vary (--randomize lighting,colors,camera)")
    return options


def check_rerender_output(source: Path, out: Path, store: Path) -> None:
    """Refuse, before anything is rendered, an ``--out`` or ``--store`` that is, lies in or holds the source (or
    each other), and an ``--out`` that is not new: only an absent or empty folder, or this rerender's own
    dataset, is accepted. Its own: a demoforge dataset every episode of which the export recorded as coming from
    ``store`` (the marker names each episode's store by the store's id), so that re-running the same command
    after a kill during or after the export resumes it; any other dataset or non-empty folder is someone else's."""
    from demoforge.storage.errors import StoreError
    from demoforge.storage.lerobot.output_guard import output_overlap
    from demoforge.storage.lerobot.publish import ExportError, resolve_target
    from demoforge.storage.paths import short_path
    from demoforge.storage.store import open_store

    for path, flag, inputs in ((out, "--out", {"the source": source, "the job's store": store}),
                               (store, "--store", {"the source": source})):
        why = output_overlap(path, inputs)
        if why is not None:
            raise RerenderInputError(f"{flag} {why}: rerender writes a new dataset from its source, through a store "
                                     "of its own; choose paths apart from both (nothing was written)")
    try:
        target = resolve_target(out)  # refuses a foreign dataset, a non-empty folder, a file, a bad path
    except ExportError as exc:
        raise RerenderInputError(f"--out: {exc}; --out is the new dataset (nothing was written)") from None
    if target.marker is None:
        return
    owners = {e.store_id for e in target.marker.episodes}
    mine: str | None = None
    try:
        with open_store(store) as view:
            mine = view.store_id()
    except StoreError:
        pass
    if mine is None or owners != {mine}:
        raise RerenderInputError(f"--out {short_path(out)} already holds a dataset that this rerender's store "
                                 f"{short_path(store)} did not export; --out is the new dataset: choose a new "
                                 "folder (nothing was written)")


def _suite(entry: TaskEntry, options: Mapping[str, Any]) -> bool:
    try:
        return bool(entry.info(options).suite)
    except ValueError:
        return False


def _key(options: Mapping[str, Any] | None) -> str:
    import json

    return json.dumps(dict(options or {}), sort_keys=True)
