"""``demoforge multiply``: many demonstrations from a few, segment by segment (MimicGen's scheme).

A multiply job is an ordinary job whose task is the wrapper task :data:`TASK` (a ``module:factory`` name, so
every process rebuilds it from its name and options: thread, process and Ray workers, replay). Its options name
the task multiplied, that task's own options, the extracted source (a content-hashed file in the job's store,
pipeline/multiply_plan.py), the strategy and the interpolation steps: the job's fingerprint covers them all, so
a re-run with the same source resumes, and another source is refused.

The source is extracted once, at the start of the command, in the driver: each source episode is replayed in
its task (seed and executed actions, as ``demoforge replay`` does, checked frame by frame) while the task's
:class:`~demoforge.stages.task_protocol.TracksPoses` capability reports the end-effector pose, every object's
pose and, per action, the pose it commanded and its gripper command. An episode that does not replay, or did not
succeed, is skipped and named. A Recorder's episodes (a teleoperation loop: no seed to replay from) carry those
poses as recorded features (:func:`pose_features`, :func:`pose_frame`) and ``--task`` names their task. A source
needs at least two usable episodes.

Each attempt (:class:`MultipliedTask`) resets from its own seed (a new scene), then for each segment of the
source's sequence picks a source episode (``random`` from the attempt's seed, or ``nearest`` reference pose),
moves that episode's segment with its reference object (pipeline/multiply_plan.py), interpolates from where the
end effector is to the moved segment's start over K steps, and commands the moved poses with the source's
gripper commands, each action computed from the state the previous one left. Validators (where the task's own
planner can be walked segment by segment) and the success check are the task's own. Every generated segment
records its provenance in its metadata (``multiply``): source episode and segment, transform, interpolation.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.pipeline.multiply_plan import (
    POSE_WIDTH,
    STRATEGIES,
    PlannedSegment,
    ExtractedEpisode,
    SourceFileError,
    ExtractedSegment,
    ExtractedSource,
    choose,
    interpolate,
    load_source,
    plan_segment,
    pose_row,
    source_file_name,
)
from demoforge.pipeline.tasks.registry import TaskEntry, TaskInfo, TaskOptionError, get_task
from demoforge.stages.contract import LEGACY_SEGMENT_NAME, Segment, TaskError
from demoforge.stages.segment_cursor import SegmentCursor
from demoforge.stages.task_protocol import Pose, TaskPoses, TracksPoses, task_capability

#: The wrapper task's name: a ``module:factory`` spec, which every process resolves by importing this module.
TASK = "demoforge.pipeline.multiply:ENTRY"
SOURCE_DIR = "multiply"  # the folder of the job's store that holds the extracted source
DEFAULT_INTERPOLATION = 5
MAX_INTERPOLATION = 1000
DEFAULTS: Mapping[str, Any] = {"task": "", "task_options": "{}", "source": "", "source_sha256": "",
                               "strategy": "random", "interpolation": DEFAULT_INTERPOLATION}
_SALT = 0x6D756C74  # "mult": the attempt's source choices are their own stream of its seed
_SHA256 = re.compile(r"[0-9a-f]{64}")
RECORDER_TASK = "recorder"  # pipeline/recorder.py's store task (not imported: it loads the recorder's writer)
MIN_SOURCE_EPISODES = 2
# What a Recorder loop records so that its recording can be multiplied (pose_features, pose_frame)
EEF_POSE = "observation.eef_pose"
COMMANDED_POSE = "observation.commanded_pose"
OBJECT_POSES = "observation.object_poses."  # + the object's name, as the task's object_poses() names it
POSE_NAMES = ("x", "y", "z", "qw", "qx", "qy", "qz")


class MultiplyInputError(TaskOptionError):
    """The source or the task cannot be multiplied as asked (the command says what and exits 2)."""


# ------------------------------------------------------------------------------------------ the wrapper task
def target_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The multiplied task's own options, from the wrapper's ``task_options`` (a JSON object)."""
    try:
        parsed = json.loads(str(options["task_options"]))
    except json.JSONDecodeError as exc:
        raise TaskOptionError(f"multiply option 'task_options' is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise TaskOptionError("multiply option 'task_options' must be a JSON object of the task's options")
    return parsed


def _check(options: Mapping[str, Any]) -> None:
    task = str(options["task"])
    if not task or task == TASK:
        raise TaskOptionError("multiply option 'task' must name the task to multiply (not the multiply task)")
    if options["strategy"] not in STRATEGIES:
        raise TaskOptionError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {options['strategy']!r}")
    if not 0 <= int(options["interpolation"]) <= MAX_INTERPOLATION:
        raise TaskOptionError(f"--interpolation must be in 0..{MAX_INTERPOLATION} steps, got "
                              f"{options['interpolation']!r}")
    digest, source = str(options["source_sha256"]), Path(str(options["source"]))
    if not _SHA256.fullmatch(digest):
        raise TaskOptionError("multiply option 'source_sha256' must be a sha256 (64 lowercase hex digits)")
    if not source.is_absolute() or source.name != source_file_name(digest):
        raise TaskOptionError(f"multiply option 'source' must be the absolute path of {source_file_name(digest)}, "
                              f"got {str(source)!r}")
    target_options(options)


def _describe(options: Mapping[str, Any]) -> TaskInfo:
    task = str(options["task"])
    info = get_task(task).info(target_options(options))
    if info.suite:
        raise TaskOptionError(f"{task!r} is a suite: multiply one task at a time")
    return replace(info, name=TASK, options=dict(options), labels_any_state=True,
                   description=f"{task} multiplied from source demonstrations (strategy {options['strategy']}, "
                               f"{options['interpolation']} interpolation steps): {info.description}")


def _make_env(options: Mapping[str, Any]) -> gym.Env:
    return MultipliedTask(get_task(str(options["task"])).build(target_options(options)), options)


ENTRY = TaskEntry(name=TASK, defaults=DEFAULTS, describe=_describe, make_env=_make_env, check=_check)


def task_poses(env: Any) -> TaskPoses | None:
    """The env's pose capability (None: it has none, or not in this configuration)."""
    tracker = task_capability(env, TracksPoses)
    return None if tracker is None else tracker.demo_poses()


class MultipliedTask(gym.Wrapper):
    """The multiplied task's env, planning each attempt from the source (see the module docstring). The
    recorder, success check, hold action, instruction and randomization stay the task's own: the executor finds
    them through the wrapper chain."""

    def __init__(self, env: gym.Env, options: Mapping[str, Any]) -> None:
        super().__init__(env)
        self.task = str(options["task"])
        self.source_path = Path(str(options["source"]))
        self.source_sha256 = str(options["source_sha256"])
        self.strategy = str(options["strategy"])
        self.interpolation = int(options["interpolation"])
        self._source: ExtractedSource | None = None
        self._seed = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._seed = 0 if seed is None else int(seed)
        return self.env.reset(seed=seed, options=options)

    def _loaded(self) -> ExtractedSource:
        if self._source is None:
            try:
                self._source = load_source(self.source_path, self.source_sha256)
            except SourceFileError as exc:
                raise TaskError(str(exc), task=TASK) from None
        return self._source

    def create_demo_segments(self) -> Iterator[Segment]:
        source = self._loaded()
        poses = task_poses(self.env)
        if poses is None:
            raise TaskError(f"task {self.task!r} does not report poses (TracksPoses): it cannot be multiplied",
                            task=TASK)
        rng = np.random.default_rng([self._seed, _SALT])
        inner = SegmentCursor(self.env, self.task) if poses.follows_plan else None
        hold: float | None = None
        for position, name in enumerate(source.sequence):
            planned = inner.plan_next() if inner is not None else None
            if inner is not None and (planned is None or planned.name != name):
                raise TaskError(f"the task plans segment {planned.name if planned else None!r} where the source "
                                f"has {name!r}", task=TASK, segment=name)
            chosen = self._plan(source, position, poses, rng)
            gripper = chosen.grippers[0] if hold is None else hold
            steps = interpolation_steps(poses, chosen.start, gripper, self.interpolation) \
                if chosen.segment.reference is not None else 0
            settle = self.interpolation if position == len(source.sequence) - 1 else 0
            metadata = {**(dict(planned.metadata) if planned is not None else {}),
                        "multiply": chosen.provenance(self.strategy, steps, settle)}
            yield Segment(actions=_actions(poses, chosen, steps, gripper, settle), name=name,
                          target=chosen.segment.target,
                          instruction=planned.instruction if planned is not None else chosen.segment.instruction,
                          metadata=metadata, validator=planned.validator if planned is not None else None)
            hold = chosen.grippers[-1]

    def _plan(self, source: ExtractedSource, position: int, poses: TaskPoses, rng: np.random.Generator) -> PlannedSegment:
        """Pick the source episode for segment ``position`` and move its segment into the current scene."""
        objects, eef = poses.object_poses(), poses.eef_pose()

        def now(episode: ExtractedEpisode) -> Pose:
            reference = episode.segments[position].reference
            if reference is None:
                return eef
            if reference not in objects:
                raise TaskError(f"the task reports no pose of {reference!r} (it reports {', '.join(objects)})",
                                task=TASK, segment=episode.segments[position].name)
            return objects[reference]

        current = [now(e) for e in source.episodes]
        index = choose(source, position, self.strategy, current, rng)
        return plan_segment(source, source.episodes[index], position, current[index])


def interpolation_steps(poses: TaskPoses, start: Pose, gripper: float, steps: int) -> int:
    """``steps``, or more where the arm cannot cover the distance to ``start`` in that many: as many as its
    largest step toward ``start`` needs (measured with the task's own conversion: the pose that the action toward
    ``start`` commands), so the moved segment starts where the source's did, not behind it."""
    here = poses.eef_pose().position
    distance = np.abs(start.position - here)
    reach = np.abs(poses.commanded_pose(poses.action_toward(start, gripper)).position - here)
    movable = (distance > 1e-9) & (reach > 1e-12)  # an axis the arm cannot move along (at its limit) is left out
    if not movable.any():
        return steps
    needed = int(np.ceil(float(np.max(distance[movable] / reach[movable])) - 1e-9))
    return max(steps, min(MAX_INTERPOLATION, needed))


def _actions(poses: TaskPoses, planned: PlannedSegment, steps: int, gripper: float,
             settle: int) -> Iterator[np.ndarray]:
    """The segment's actions, each computed when the executor asks for it (from the state the previous one
    left): ``steps`` toward the moved segment's start, one toward each moved commanded pose, then ``settle``
    holding the last one (the episode's last segment: the source ended where its task first succeeded, and the
    arm lags its command)."""
    begin = poses.eef_pose()
    for k in range(1, steps + 1):
        yield poses.action_toward(interpolate(begin, planned.start, k / steps), gripper)
    for target, command in zip(planned.targets, planned.grippers):
        yield poses.action_toward(target, command)
    for _ in range(settle):
        yield poses.action_toward(planned.targets[-1], planned.grippers[-1])


# ----------------------------------------------------------------------------------- extracting the source
@dataclass(frozen=True)
class MultiplySource:
    """A checked source, extracted: what the job multiplies, in which task and options, and what was skipped."""

    task: str
    task_options: Mapping[str, Any]
    source: ExtractedSource
    skipped: tuple[str, ...]  # one line per source episode left out, naming it and why

    def job_options(self, file: Path, strategy: str, interpolation: int) -> dict[str, Any]:
        """The wrapper task's options for a job whose extracted source is ``file``."""
        return {"task": self.task, "task_options": json.dumps(dict(self.task_options), sort_keys=True),
                "source": str(file.resolve()), "source_sha256": self.source.content_hash(),
                "strategy": strategy, "interpolation": interpolation}


class _PoseRecorder(gym.Wrapper):
    """Records what the source episode did while replay steps it: frame ``t``'s poses when action ``t`` is
    stepped (after any planning for that frame: fetch sets a cycle's goal as it plans it), the pose and gripper
    each action commanded, and the poses after the last action (:meth:`finish`)."""

    def __init__(self, env: gym.Env, object_names: tuple[str, ...] | None) -> None:
        super().__init__(env)
        self.names = object_names  # None: the objects of the first frame, in name order
        self.eef: list[np.ndarray] = []
        self.objects: list[np.ndarray] = []
        self.commanded: list[np.ndarray] = []
        self.gripper: list[float] = []

    def _poses(self) -> TaskPoses:
        poses = task_poses(self.env)
        if poses is None:
            raise TaskError("the task stopped reporting poses")
        return poses

    def _frame(self) -> TaskPoses:
        poses = self._poses()
        objects = poses.object_poses()
        if self.names is None:
            self.names = tuple(sorted(objects))
        if set(objects) != set(self.names):
            raise TaskError(f"the task reports poses of {', '.join(sorted(objects))} here, of "
                            f"{', '.join(self.names)} before")
        self.eef.append(pose_row(poses.eef_pose()))
        self.objects.append(np.stack([pose_row(objects[n]) for n in self.names]))
        return poses

    def step(self, action: Any) -> Any:
        poses = self._frame()
        self.commanded.append(pose_row(poses.commanded_pose(np.asarray(action))))
        self.gripper.append(float(poses.gripper(np.asarray(action))))
        return self.env.step(action)

    def finish(self) -> None:
        self._frame()


def _effective(task: str, options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """The task a source episode demonstrates, and its options: a multiplied episode's are its wrapper's."""
    if task == TASK and options is not None:
        return str(options.get("task", "")), target_options(options)
    return task, dict(options) if options is not None else None


def _segments(record: Mapping[str, Any], frames: int) -> list[dict[str, Any]] | None:
    """The record's segments if they tile ``[0, frames)`` in order, else None."""
    segments = list(record.get("segments") or [])
    at = 0
    for seg in segments:
        if int(seg.get("start_step", -1)) != at or int(seg.get("end_step", -1)) <= at:
            return None
        at = int(seg["end_step"])
    return segments if segments and at == frames else None


def _unsegmented(segments: list[dict[str, Any]]) -> bool:
    """One segment of the contract's default name, with no target: a plain list of actions."""
    return len(segments) == 1 and segments[0].get("name") == LEGACY_SEGMENT_NAME and not segments[0].get("target")


def extract_source(path: Path, task: str | None, overrides: Mapping[str, Any],
                   on_note: Callable[[str], None] = lambda _line: None) -> MultiplySource:
    """Check ``path`` as a source for ``task`` (None: the source's own) and extract it: by replaying each episode,
    or from the poses a Recorder loop recorded; raises :class:`MultiplyInputError` naming what cannot be
    multiplied. Writes nothing."""
    from demoforge.pipeline.replay import EnvCache
    from demoforge.storage.episode_source import EpisodeReadError, EpisodeSourceError, open_episode_source

    try:
        opened = open_episode_source(path)
    except EpisodeSourceError as exc:
        raise MultiplyInputError(f"SOURCE: {exc}") from None
    envs = EnvCache()
    try:
        try:
            refs = opened.episodes()
            headers = [opened.header(ref) for ref in refs]
        except (EpisodeSourceError, EpisodeReadError) as exc:
            raise MultiplyInputError(f"SOURCE: {exc}") from None
        if not refs:
            raise MultiplyInputError(f"{path} has no episodes to multiply")
        effective = [_effective(ref.task, options) for ref, (_, options) in zip(refs, headers)]
        tasks = sorted({t for t, _ in effective})
        if len(tasks) > 1:
            raise MultiplyInputError(f"{path} holds episodes of {len(tasks)} tasks ({', '.join(tasks)}): multiply "
                                     "one task at a time (`demoforge edit --keep-where` selects one)")
        if tasks[0] == RECORDER_TASK:
            return _extract_recorded(path, opened, list(zip(refs, headers)), task, dict(overrides), envs, on_note)
        if task is not None and tasks[0] != task:
            raise MultiplyInputError(f"{path} holds episodes of task {tasks[0]!r}, not {task!r}: a source is "
                                     "multiplied in its own task")
        target, first_options = tasks[0], effective[0][1]
        if first_options is None:
            raise MultiplyInputError(f"{path} does not record the task options its episodes were made with "
                                     "(exported by an older demoforge): multiply its store, or re-export it")
        options = {**first_options, **overrides}
        _check_task(path, target, options, tuple(opened.schema.action_shape))
        segmented = _checked_segments(path, refs, headers)
        _capable(_env(envs, refs[0].task, headers[0][1] or {}, refs[0].label), target)
        _check_count(path, len(refs))
        return _extract(path, opened, list(zip(refs, headers, segmented)), target, options, envs, on_note)
    finally:
        envs.close()
        opened.close()


def _check_task(path: Path, task: str, options: Mapping[str, Any], action_shape: tuple[int, ...]) -> None:
    """The task is one task (not a suite) whose actions have the source's shape."""
    info = get_task(task).info(options)
    if info.suite:
        raise MultiplyInputError(f"{task!r} is a suite: multiply one member task at a time")
    if action_shape != tuple(info.action_shape):
        raise MultiplyInputError(f"{path} records actions of shape {action_shape}; task {task!r} takes "
                                 f"{tuple(info.action_shape)}: a source is multiplied in its own action space")


def _checked_segments(path: Path, refs: list[Any], headers: list[Any]) -> list[list[dict[str, Any]] | None]:
    """Each episode's segments (None: they do not tile its frames); refused when no episode has segments, or no
    segment names a target."""
    segmented = [_segments(record, ref.frames) for ref, (record, _) in zip(refs, headers)]
    if not any(segs and not _unsegmented(segs) for segs in segmented):
        raise MultiplyInputError(f"{path} records no segments (each episode is one plan of actions at most): "
                                 "multiply moves each segment of a demonstration with the object it acts on")
    if not any(s.get("target") for segs in segmented if segs for s in segs):
        raise MultiplyInputError(f"no segment of {path} names a target object: multiply moves each segment "
                                 "with its target (Segment(target=...); a Recorder's add_frame(..., target=...))")
    return segmented


def _check_count(path: Path, episodes: int) -> None:
    """Refuse a source of one episode (issue 58): every generated segment would come from that one
    demonstration, so no choice of source segment is left to vary, and one is usually a wrong selection."""
    if episodes < MIN_SOURCE_EPISODES:
        raise MultiplyInputError(f"{path} holds 1 episode: multiply needs at least {MIN_SOURCE_EPISODES} source "
                                 "demonstrations to choose each segment from (generate or record more)")


def _env(envs: Any, task: str, options: Mapping[str, Any], label: str) -> Any:
    try:
        return envs.get(task, options)
    except Exception as exc:  # the task's own build: name it, as replay does
        raise MultiplyInputError(f"cannot build task {task!r} to read {label}: {type(exc).__name__}: {exc}") from None


def _capable(env: Any, task: str) -> TaskPoses:
    poses = task_poses(env)
    if poses is None:
        raise MultiplyInputError(f"task {task!r} cannot be multiplied: it does not report the poses of its "
                                 "robot and objects (the TracksPoses capability, docs/writing-a-task.md)")
    return poses


class _Skips:
    """The source episodes left out, one line each (also reported as they happen)."""

    def __init__(self, on_note: Callable[[str], None]) -> None:
        self.lines: list[str] = []
        self.on_note = on_note

    def __call__(self, label: str, why: str) -> None:
        self.lines.append(f"skipped source {label}: {why}")
        self.on_note(self.lines[-1])


def _extract(path: Path, opened: Any, episodes_in: list[tuple[Any, Any, list[dict[str, Any]] | None]], target: str,
             options: dict[str, Any], envs: Any, on_note: Callable[[str], None]) -> MultiplySource:
    """Replay each usable source episode (reference, header, segments) with a :class:`_PoseRecorder` and collect
    what it did."""
    from demoforge.pipeline.replay import EpisodeReplay, default_tolerance
    from demoforge.storage.episode_source import EpisodeReadError

    skip = _Skips(on_note)
    names: tuple[str, ...] | None = None
    episodes: list[ExtractedEpisode] = []
    for ref, (record, _), segments in episodes_in:
        if not record.get("success", True):
            skip(ref.label, "it did not succeed (a kept failure is no demonstration)")
            continue
        if segments is None:
            skip(ref.label, "its segments do not cover its frames in order")
            continue
        try:
            episode = opened.load(ref)
        except EpisodeReadError as exc:
            skip(ref.label, f"cannot be read: {exc}")
            continue
        env = _env(envs, ref.task, episode.task_options or {}, ref.label)
        poses = _capable(env, target)
        recorder = _PoseRecorder(env, names)
        try:
            divergence, _, _ = EpisodeReplay(recorder, episode, tolerance=default_tolerance(target)).run()
            recorder.finish()
        except Exception as exc:  # the replay could not be carried out (reset, the recorder)
            envs.close()
            skip(ref.label, f"does not replay: {type(exc).__name__}: {exc}")
            continue
        if divergence is not None:
            skip(ref.label, f"does not replay (frame {divergence.frame}, {divergence.kind}): {divergence.detail}")
            continue
        names = recorder.names
        assert names is not None
        parts = _parts(poses, segments)
        _check_references(parts, names, ref.label, f"task {target!r} reports no pose of", f"it reports "
                          f"{', '.join(names)}")
        episodes.append(ExtractedEpisode(number=ref.number, label=ref.label, seed=ref.seed, segments=parts,
                                         eef=np.stack(recorder.eef), commanded=np.stack(recorder.commanded),
                                         gripper=np.asarray(recorder.gripper, dtype=np.float64),
                                         objects=np.stack(recorder.objects)))
    return _assemble(path, target, options, names or (), episodes, skip)


def _parts(poses: TaskPoses, segments: list[dict[str, Any]]) -> tuple[ExtractedSegment, ...]:
    return tuple(ExtractedSegment(index=i, name=str(s["name"]), target=s.get("target"),
                                  instruction=s.get("instruction"), start=int(s["start_step"]),
                                  end=int(s["end_step"]), reference=poses.reference(str(s["name"]), s.get("target")))
                 for i, s in enumerate(segments))


def _check_references(parts: tuple[ExtractedSegment, ...], names: Collection[str], label: str, what: str,
                      known: str) -> None:
    missing = sorted({s.reference for s in parts if s.reference is not None and s.reference not in names})
    if missing:
        raise MultiplyInputError(f"segments of {label} move with {', '.join(map(repr, missing))}, which {what} "
                                 f"({known})")


def _assemble(path: Path, target: str, options: dict[str, Any], names: tuple[str, ...],
              episodes: list[ExtractedEpisode], skip: _Skips) -> MultiplySource:
    """The extracted source: the episodes of the most common segment sequence (others skipped, named), at
    least :data:`MIN_SOURCE_EPISODES` of them."""
    if not episodes:
        raise MultiplyInputError(f"no episode of {path} can be multiplied: " + "; ".join(skip.lines))
    sequences = Counter(tuple(s.name for s in e.segments) for e in episodes)
    sequence = max(sequences, key=lambda seq: (sequences[seq], -next(i for i, e in enumerate(episodes)
                                                                     if tuple(s.name for s in e.segments) == seq)))
    kept = []
    for e in episodes:
        if tuple(s.name for s in e.segments) == sequence:
            kept.append(e)
        else:
            skip(e.label, f"its segments ({' '.join(s.name for s in e.segments)}) differ from the other episodes' "
                          f"({' '.join(sequence)})")
    if len(kept) < MIN_SOURCE_EPISODES:
        raise MultiplyInputError(f"only 1 episode of {path} can be multiplied (the others were skipped, named "
                                 f"above): multiply needs at least {MIN_SOURCE_EPISODES}")
    return MultiplySource(task=target, task_options=options, skipped=tuple(skip.lines),
                          source=ExtractedSource(task=target, source=str(path.resolve()), object_names=names,
                                                 episodes=tuple(kept)))


# ------------------------------------------------------------------------------------ Recorder-made sources
def pose_features(env: Any) -> dict[str, dict[str, Any]]:
    """The features a Recorder loop over ``env`` (a demoforge task's env, reset) adds to its own so that its
    recording can be multiplied: :data:`EEF_POSE`, :data:`COMMANDED_POSE` and one :data:`OBJECT_POSES`
    ``<name>`` per object the task reports, each 7 float32 (x, y, z, qw, qx, qy, qz; world frame)."""
    poses = _loop_poses(env)
    keys = (EEF_POSE, COMMANDED_POSE, *(OBJECT_POSES + name for name in sorted(poses.object_poses())))
    return {key: {"dtype": "float32", "shape": (POSE_WIDTH,), "names": list(POSE_NAMES)} for key in keys}


def pose_frame(env: Any, action: Any) -> dict[str, np.ndarray]:
    """This frame's values of :func:`pose_features`, read before ``action`` is stepped: where the end effector
    and the objects are, and the pose ``action`` commands from here (the task's own conversion)."""
    poses = _loop_poses(env)
    frame = {EEF_POSE: pose_row(poses.eef_pose()),
             COMMANDED_POSE: pose_row(poses.commanded_pose(np.asarray(action, dtype=np.float64)))}
    frame.update({OBJECT_POSES + name: pose_row(pose) for name, pose in poses.object_poses().items()})
    return {key: value.astype(np.float32) for key, value in frame.items()}


def _loop_poses(env: Any) -> TaskPoses:
    poses = task_poses(env)
    if poses is None:
        raise TaskOptionError(f"{type(env).__name__} does not report poses (TracksPoses): a recording of it cannot "
                              "be multiplied")
    return poses


def _recorded_poses(state: Mapping[str, np.ndarray], key: str, label: str) -> np.ndarray:
    """A recorded pose feature's rows as float64, each a finite position and a non-zero quaternion; a
    :class:`ValueError` naming the first frame that is not."""
    rows = np.asarray(state[key], dtype=np.float64)
    norms = np.linalg.norm(rows[:, 3:POSE_WIDTH], axis=1)
    bad = ~np.all(np.isfinite(rows), axis=1) | ~(norms > 1e-9)
    if bad.any():
        raise ValueError(f"frame {int(np.argmax(bad))}'s {key} is not a pose (a finite position and a non-zero "
                         f"quaternion w, x, y, z)")
    return rows


def _extract_recorded(path: Path, opened: Any, episodes_in: list[tuple[Any, Any]], task: str | None,
                      options: dict[str, Any], envs: Any, on_note: Callable[[str], None]) -> MultiplySource:
    """A Recorder's episodes name no task and cannot be replayed from a seed (a teleoperation loop is not
    seeded): the task is ``--task``'s, with its default options overlaid with ``--option``, and the poses are
    the ones the loop recorded (:func:`pose_features`); the gripper commands are read from the actions by the
    task. The frame after the last action is not recorded: its poses are the last frame's."""
    from demoforge.storage.episode_source import EpisodeReadError

    if task is None:
        raise MultiplyInputError(f"{path} was written by a Recorder, whose episodes name no task: name the task "
                                 "its loop ran over with --task")
    _check_task(path, task, options, tuple(opened.schema.action_shape))
    shapes = {key: tuple(shape) for key, shape in opened.schema.state_shapes.items()}
    names = tuple(sorted(key[len(OBJECT_POSES):] for key in shapes if key.startswith(OBJECT_POSES)))
    missing = [key for key in (EEF_POSE, COMMANDED_POSE) if key not in shapes] + \
        ([f"{OBJECT_POSES}<name>"] if not names else [])
    if missing:
        raise MultiplyInputError(f"{path} was written by a Recorder and records no {', '.join(missing)}: record the "
                                 "poses multiply moves (pose_features and pose_frame, docs/multiply.md)")
    wrong = sorted(key for key in (EEF_POSE, COMMANDED_POSE, *(OBJECT_POSES + n for n in names))
                   if shapes[key] != (POSE_WIDTH,))
    if wrong:
        raise MultiplyInputError(f"{path} records {', '.join(wrong)} with another shape than ({POSE_WIDTH},) "
                                 f"({', '.join(POSE_NAMES)})")
    refs, headers = [r for r, _ in episodes_in], [h for _, h in episodes_in]
    segmented = _checked_segments(path, refs, headers)
    env = _env(envs, task, options, "the source")
    poses = _capable(env, task)
    _check_count(path, len(refs))
    env.reset(seed=0)
    reported = tuple(sorted(poses.object_poses()))
    skip = _Skips(on_note)
    episodes: list[ExtractedEpisode] = []
    for ref, (record, _), segments in zip(refs, headers, segmented):
        if segments is None:
            skip(ref.label, "its segments do not cover its frames in order")
            continue
        parts = _parts(poses, segments)
        _check_references(parts, names, ref.label, f"{path} records no pose of",
                          f"it records {', '.join(OBJECT_POSES + n for n in names)}")
        _check_references(parts, reported, ref.label, f"task {task!r} reports no pose of",
                          f"it reports {', '.join(reported)}")
        try:
            episode = opened.load(ref)
            eef, commanded = (_recorded_poses(episode.state, key, ref.label) for key in (EEF_POSE, COMMANDED_POSE))
            objects = np.stack([_recorded_poses(episode.state, OBJECT_POSES + n, ref.label) for n in names], axis=1)
        except EpisodeReadError as exc:
            skip(ref.label, f"cannot be read: {exc}")
            continue
        except ValueError as exc:
            skip(ref.label, str(exc))
            continue
        gripper = np.array([poses.gripper(np.asarray(a, dtype=np.float64)) for a in episode.action])
        episodes.append(ExtractedEpisode(number=ref.number, label=ref.label, seed=ref.seed, segments=parts,
                                         eef=np.concatenate([eef, eef[-1:]]), commanded=commanded, gripper=gripper,
                                         objects=np.concatenate([objects, objects[-1:]])))
    return _assemble(path, task, options, names, episodes, skip)
