"""The synchronous episode executor: runs a task's segments on a gymnasium Env or the rows of a VectorEnv.

It emits records (:mod:`demoforge.stages.records`) and never decides durability: whether an attempt
becomes data is the commit stage's call, made from ``AttemptEnded.result.committable``.

Each vector row is its own episode and its own transaction. A row whose attempt ended is reset alone (the
others keep their state) and starts its next attempt or its next episode; a row with no work left holds
still (the task's ``demo_hold_action``, else zeros) and records nothing while the other rows continue.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from demoforge.stages.contract import (
    Annotations,
    DemoError,
    EnvError,
    EpisodeResult,
    KEEPABLE_FAILURES,
    ObservationError,
    RecordedObservation,
    Segment,
    SegmentResult,
    StepView,
    TaskError,
    TaskProtocolError,
    TerminalReason,
    check_json_safe,
)
from demoforge.stages.actions import check_action, default_hold_action
from demoforge.stages.attempts import RetryPolicy
from demoforge.stages.control import (
    EXECUTED_ACTION,
    INTERVENTION,
    AttemptControl,
    ControlSpec,
    GuardedPolicy,
    Policy,
    PolicyError,
    describe_failure,
)
from demoforge.stages.task_protocol import (
    GivesInstruction,
    HoldsAction,
    Randomizes,
    SeedsAttempt,
    SelectsEpisode,
    recorder_of,
    success_check,
    task_capability,
)
from demoforge.stages.records import (
    PENDING,
    AttemptEnded,
    AttemptKey,
    AttemptStarted,
    EpisodeAbandoned,
    EpisodeAssignment,
    EpisodeLayout,
    Frame,
    Record,
    WorkSource,
)
from demoforge.stages.segment_cursor import Advance, SegmentCursor
from demoforge.storage.schema import CameraSpec


def derive_seed(job_seed: int, episode_index: int, attempt: int) -> int:
    """The env seed of one attempt: a pure function of its identity, so a resumed job replays a clean one."""
    state = np.random.SeedSequence([int(job_seed) & 0xFFFFFFFF, int(episode_index), int(attempt)])
    return int(state.generate_state(1, dtype=np.uint32)[0])


class RangeWorkSource:
    """A simple work source: episode indices ``start .. start+count-1``, each from attempt 0; with a suite's
    ``layout``, those ``count`` episodes of every member in turn."""

    def __init__(self, count: int, start: int = 0, layout: EpisodeLayout | None = None) -> None:
        layout = layout or EpisodeLayout()
        self._indices = iter([layout.index(group, k) for group in range(layout.groups)
                              for k in range(start, start + count)])

    def next_episode(self, wait: bool = True) -> EpisodeAssignment | None:
        index = next(self._indices, None)
        return None if index is None else EpisodeAssignment(index)


# ----------------------------------------------------------------------------------------- recording
class _Shapes:
    """Remembers each recorded key's shape and dtype from the first frame; later frames must match."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    def check(self, kind: str, name: str, array: np.ndarray) -> None:
        sig = (array.shape, array.dtype)
        known = self._seen.setdefault(f"{kind}:{name}", sig)
        if known != sig:
            raise ObservationError(f"{kind} {name!r} changed from shape {known[0]} {known[1]} to "
                                   f"{array.shape} {array.dtype}")


def _check_depth(name: str, value: Any, spec: CameraSpec) -> np.ndarray:
    """A depth camera's image: (H, W) of the declared size, floating point, finite, non-negative metres."""
    image = np.asarray(value)
    if image.dtype.kind != "f" or image.ndim != 2:
        raise ObservationError(f"depth camera {name!r} gave {image.shape} {image.dtype}; expected (H, W) float32 "
                               "metres (no channel axis)")
    if image.shape != spec.shape:
        raise ObservationError(f"depth camera {name!r} gave a {image.shape[0]}x{image.shape[1]} image; the task "
                               f"declares {spec.height}x{spec.width}")
    image = image.astype(np.float32, copy=False)
    finite = np.isfinite(image)
    if not finite.all():
        raise ObservationError(f"depth camera {name!r} has {int(image.size - finite.sum())} NaN or inf pixel(s)")
    if (image < 0).any():
        raise ObservationError(f"depth camera {name!r} has {int((image < 0).sum())} negative pixel(s) "
                               f"(min {float(image.min()):.4g} m)")
    return image


def _check_recorded(rec: Any, shapes: _Shapes, cameras: Mapping[str, CameraSpec] | None = None
                    ) -> RecordedObservation:
    if not isinstance(rec, RecordedObservation):
        raise TaskProtocolError(f"demo_record returned {type(rec).__name__}; expected RecordedObservation")
    state: dict[str, np.ndarray] = {}
    for name, value in rec.state.items():
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise ObservationError(f"state {name!r} has non-numeric dtype {array.dtype}")
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise ObservationError(f"state {name!r} contains NaN or inf")
        shapes.check("state", name, array)
        state[name] = array
    images: dict[str, np.ndarray] = {}
    for name, value in rec.images.items():
        spec = cameras.get(name) if cameras is not None else None
        if spec is not None and spec.is_depth:
            image = _check_depth(name, value, spec)
            shapes.check("camera", name, image)
            images[name] = image
            continue
        image = np.asarray(value)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ObservationError(f"camera {name!r} gave {image.shape} {image.dtype}; expected (H, W, 3) uint8")
        shapes.check("camera", name, image)
        images[name] = image
    return RecordedObservation(state=state, images=images)


# ------------------------------------------------------------------------------------------- attempt


def _draw_randomization(att: _Attempt, randomize: Callable[..., Any], seed: int) -> Mapping[str, Any] | None:
    drawn = att._task_call("demo_randomize", randomize, seed)
    if drawn is None:
        return None
    if not isinstance(drawn, Mapping):
        raise TaskProtocolError(f"demo_randomize returned {type(drawn).__name__}; expected a mapping or None")
    check_json_safe(drawn, "demo_randomize's drawn values")
    return drawn


class _Attempt:
    """One attempt's cursor: the plan, the current segment's actions, the counters and the results."""

    def __init__(self, task: str, env: Any, key: AttemptKey, seed: int, row: int,
                 action_space: gym.Space, shapes: _Shapes, cameras: Mapping[str, CameraSpec] | None = None,
                 control: ControlSpec | None = None, keep_failures: bool = False) -> None:
        self.task, self.env, self.key, self.seed, self.row = task, env, key, seed, row
        self.control_spec = control
        self.keep_failures = keep_failures
        self.control: AttemptControl | None = None  # built at begin(), after the reset
        self.executed: np.ndarray | None = None  # what the next step executes (the label unless controlled)
        self.intervened = False
        self.action_space = action_space
        self.shapes = shapes
        self.cameras = cameras
        self.started = time.perf_counter()
        self.step = 0
        self.cursor = SegmentCursor(env, task, self._task_call)
        self.segment_start = 0
        self.segment_step = 0
        self.action: np.ndarray | None = None
        self.segments: list[SegmentResult] = []
        self.recorded: RecordedObservation | None = None
        self.instruction: str | None = None
        self.randomization: Mapping[str, Any] | None = None
        self.result: EpisodeResult | None = None
        self._record: Callable[[Any], Any] = recorder_of(env)
        self._success: Callable[[Any, Mapping[str, Any]], bool | None] = success_check(env)

    def bind_task(self) -> None:
        """Find the recorder and success check on the env as it is now: a suite becomes the episode's member
        after the attempt is made (demo_select_episode), and that member records and judges the episode."""
        self._record, self._success = recorder_of(self.env), success_check(self.env)

    @property
    def segment(self) -> Segment | None:
        return self.cursor.segment

    @property
    def segment_id(self) -> int:
        return self.cursor.segment_id

    # -- helpers
    def where(self) -> dict[str, Any]:
        return {"task": self.task, "segment": self.segment.name if self.segment else None,
                "segment_id": self.segment_id if self.segment else None, "step": self.step}

    def _task_call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except DemoError:
            raise
        except Exception as exc:
            raise TaskError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    def observe(self, observation: Any) -> None:
        rec = self._task_call("demo_record", self._record, observation)
        self.recorded = _check_recorded(rec, self.shapes, self.cameras)

    # -- planning
    def begin(self, observation: Any, policy: Policy | None = None) -> None:
        """Called after reset: record the first observation and fetch the first segment and action."""
        if self.control_spec is not None:
            self.control = AttemptControl(self.control_spec, self.seed, self.action_space, policy)
        instructor = task_capability(self.env, GivesInstruction)
        self.instruction = str(instructor.demo_instruction()) if instructor is not None else None
        self.observe(observation)
        begun = self.cursor.begin()
        if begun is Advance.PLAN_ENDED:
            self._finish(TerminalReason.EMPTY_PLAN, completed=False, success=False)
            return
        self._segment_began(begun)

    def _segment_began(self, advance: Advance) -> None:
        """A segment was planned: take its first action, or fail the attempt when it has none."""
        self.segment_start, self.segment_step = self.step, 0
        if advance is Advance.EMPTY_SEGMENT:
            self._close_segment(False, "segment yielded no actions")
            self._finish(TerminalReason.EMPTY_SEGMENT, completed=False, success=False)
            return
        self._take_action()

    def _take_action(self) -> None:
        self.action = check_action(self.cursor.action, self.action_space)

    def choose(self) -> np.ndarray:
        """What the next step executes: the expert's action, or what the attempt's control makes of it."""
        assert self.action is not None
        if self.control is None:
            self.executed = self.action
        else:
            assert self.recorded is not None and self.segment is not None
            self.executed, self.intervened = self.control.choose(self.action, self.recorded, self.segment_id,
                                                                 self.segment.name)
        return self.executed

    def _segment_ended(self, accepted: bool) -> None:
        self._close_segment(accepted, None if accepted else "validator rejected the segment")

    def _close_segment(self, success: bool, reason: str | None) -> None:
        seg = self.segment
        assert seg is not None
        self.segments.append(SegmentResult(
            segment_id=self.segment_id, name=seg.name, start_step=self.segment_start, end_step=self.step,
            success=success, failure_reason=None if success else reason, target=seg.target,
            instruction=seg.instruction, metadata=dict(seg.metadata)))

    def _episode_success(self, view: StepView) -> bool | None:
        verdict: bool | None = self._task_call("demo_success", self._success, view.observation, view.info)
        return verdict

    # -- stepping
    def after_step(self, observation: Any, reward: float, terminated: bool, truncated: bool,
                   info: Mapping[str, Any]) -> Frame:
        """Account one env step: builds its frame (with every flag known) and advances the plan."""
        assert self.action is not None and self.recorded is not None and self.segment is not None
        action, recorded = self.action, self.recorded
        state = recorded.state
        if self.control is not None:
            state = {**state, EXECUTED_ACTION: np.asarray(self.executed, dtype=np.float32),
                     INTERVENTION: np.array([float(self.intervened)], dtype=np.float32)}
        episode_step, segment_step = self.step, self.segment_step
        self.step += 1
        self.segment_step += 1
        segment_id = self.segment_id  # the frame belongs to the segment its action came from
        view = StepView(observation, float(reward), bool(terminated), bool(truncated), info)
        seg_end, ep_terminated = self._advance(view)
        if self.result is None:
            self.observe(observation)
        return Frame(
            key=self.key, step=episode_step, state=state, action=action, reward=float(reward),
            annotations=Annotations(
                episode_step=episode_step, segment_id=segment_id, segment_step=segment_step,
                segment_start=segment_step == 0, segment_end=seg_end, terminated=ep_terminated,
                truncated=bool(truncated)),
            images=recorded.images)

    def _advance(self, view: StepView) -> tuple[bool, bool]:
        """Advance after a step. Returns (this frame ends its segment, this frame ends the episode as terminal)."""
        if view.truncated:
            self._close_segment(False, "env truncated")
            self._finish(TerminalReason.TRUNCATED, completed=False, success=False, truncated=True,
                         terminated=view.terminated)
            return True, view.terminated
        if view.terminated:
            success = bool(self._episode_success(view))
            self._close_segment(success, None if success else "env terminated")
            self._finish(TerminalReason.SUCCESS if success else TerminalReason.FAILURE,
                         completed=success, success=success, terminated=True)
            return True, True
        # When the segment's actions run out: validate, then plan the next one from the state it left.
        advance = self.cursor.advance(view, on_end=self._segment_ended)
        if advance is Advance.SAME_SEGMENT:
            self._take_action()
            return False, False
        if advance is Advance.REJECTED:
            self._finish(TerminalReason.SEGMENT_VALIDATION_FAILED, completed=False, success=False)
            return True, False
        if advance is not Advance.PLAN_ENDED:
            self._segment_began(advance)
            return True, False
        verdict = self._episode_success(view)
        if verdict is None or verdict:
            self._finish(TerminalReason.SUCCESS, completed=True, success=True, terminated=True)
            return True, True
        self._finish(TerminalReason.TASK_INCOMPLETE, completed=True, success=False)
        return True, False

    def _finish(self, reason: TerminalReason, *, completed: bool, success: bool, terminated: bool = False,
                truncated: bool = False, error: DemoError | None = None) -> None:
        if self.result is not None:
            return
        self.result = EpisodeResult(
            task=self.task, episode_index=self.key.episode_index, attempt=self.key.attempt, seed=self.seed,
            row=self.row, length=self.step, completed=completed, success=success, terminated=terminated,
            truncated=truncated, terminal_reason=reason, segments=tuple(self.segments),
            instruction=self.instruction, error=str(error) if error else None,
            error_type=type(error).__name__ if error else None,
            duration_s=time.perf_counter() - self.started,
            driver=self.control_spec.describe() if self.control_spec is not None else None,
            interventions=self.control.interventions if self.control is not None else 0,
            randomization=self.randomization)
        if self.keep_failures and self.step > 0 and reason in KEEPABLE_FAILURES and not self.result.committable:
            self.result = dataclasses.replace(self.result, kept=True)

    def fail(self, error: DemoError) -> None:
        error.locate(**self.where())
        self._finish(TerminalReason.ERROR, completed=False, success=False, error=error)

    def interrupt(self) -> None:
        self._finish(TerminalReason.INTERRUPTED, completed=False, success=False)


# -------------------------------------------------------------------------------------------- rows
class _Rows:
    """Uniform per-row access to a plain Env (one row) or a SyncVectorEnv-like VectorEnv."""

    def __init__(self, env: gym.Env | gym.vector.VectorEnv) -> None:
        self.env = env
        self.vector = isinstance(env, gym.vector.VectorEnv)
        if isinstance(env, gym.vector.VectorEnv):
            row_envs = getattr(env, "envs", None)
            if row_envs is None:
                raise TaskProtocolError(
                    f"{type(env).__name__} does not expose its row envs (.envs); the executor needs in-process "
                    "rows (gymnasium SyncVectorEnv) so each row's task can plan from its state. Use several "
                    "workers for process parallelism.")
            mode = env.metadata.get("autoreset_mode")
            if mode is not None and getattr(mode, "name", str(mode)) != "DISABLED":
                raise TaskProtocolError(
                    f"the VectorEnv uses autoreset mode {getattr(mode, 'name', mode)}; create it with "
                    "autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED so rows reset only when told")
            self.row_envs = list(row_envs)
            self.action_space = env.single_action_space
        else:
            self.row_envs = [env]
            self.action_space = env.action_space
        self.n = len(self.row_envs)
        self._initialized = False

    def reset_row(self, row: int, seed: int | None) -> tuple[Any, dict[str, Any]]:
        if not self.vector:
            return self.env.reset(seed=seed)
        seeds = [seed if i == row else None for i in range(self.n)]
        rows: Any = self.env  # gymnasium's stubs type VectorEnv.reset's seed as one int; SyncVectorEnv takes a list
        if not self._initialized:
            # gymnasium fills its batched observation buffer only on a full reset; rows other than this
            # one are reset again, with their own seeds, when they start their first attempt.
            obs, info = rows.reset(seed=seeds)
            self._initialized = True
        else:
            mask = np.zeros(self.n, dtype=bool)
            mask[row] = True
            obs, info = rows.reset(seed=seeds, options={"reset_mask": mask})
        return _row_of(obs, row), _row_info(info, row)

    def step(self, actions: list[np.ndarray]) -> list[tuple[Any, float, bool, bool, dict[str, Any]]]:
        if not self.vector:
            obs, reward, terminated, truncated, info = self.env.step(actions[0])
            return [(obs, float(reward), bool(terminated), bool(truncated), info)]
        rows: Any = self.env  # a VectorEnv: arrays of rewards and flags, one per row
        obs, reward, terminated, truncated, info = rows.step(np.stack(actions))
        return [(_row_of(obs, i), float(reward[i]), bool(terminated[i]), bool(truncated[i]), _row_info(info, i))
                for i in range(self.n)]


def _row_of(tree: Any, row: int) -> Any:
    if isinstance(tree, Mapping):
        return {k: _row_of(v, row) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_row_of(v, row) for v in tree)
    return tree[row]


def _row_info(info: Mapping[str, Any], row: int) -> dict[str, Any]:
    """Gymnasium vector infos hold arrays plus ``_key`` masks saying which rows set the key."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not bool(np.asarray(mask)[row]):
            continue
        out[key] = _row_info(value, row) if isinstance(value, Mapping) else value[row]
    return out


# ------------------------------------------------------------------------------------------ executor
class _RowSlot:
    """One vector row: the episode it is producing, the attempt in progress and the frames it emitted.

    A slot with no attempt holds still; a slot whose attempt has a result is settled before the next step.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.assignment: EpisodeAssignment | None = None
        self.attempt: _Attempt | None = None
        self.frames = 0

    @property
    def active(self) -> bool:
        return self.attempt is not None

    def start(self, attempt: _Attempt) -> None:
        self.attempt = attempt
        self.frames = 0

    def step(self, outcome: tuple[Any, float, bool, bool, dict[str, Any]]) -> Frame | None:
        """Account this row's step; the frame, or None when the task or observation failed the attempt."""
        assert self.attempt is not None
        try:
            frame = self.attempt.after_step(*outcome)
        except DemoError as exc:
            self.attempt.fail(exc)
            return None
        self.frames += 1
        return frame

    def end(self) -> AttemptEnded:
        """Close the ended attempt; the slot holds until it is given the next attempt or episode."""
        attempt = self.attempt
        assert attempt is not None and attempt.result is not None
        self.attempt = None
        return AttemptEnded(key=attempt.key, result=attempt.result, frames=self.frames)


class _Feed:
    """The work source seen by one run: remembers that it ran dry, and folds PENDING into "nothing now"."""

    def __init__(self, work: WorkSource) -> None:
        self.work = work
        self.exhausted = False

    def take(self, wait: bool) -> EpisodeAssignment | None:
        if self.exhausted:
            return None
        assignment = self.work.next_episode(wait=wait)
        if assignment is PENDING:
            return None
        if assignment is None:
            self.exhausted = True
            return None
        assert isinstance(assignment, EpisodeAssignment)
        return assignment


class Executor:
    """Runs episodes from a :class:`WorkSource` until it runs dry, retrying each up to ``max_attempts``.

    ``interrupt`` is polled before every env step; when it returns True every active attempt ends as
    ``interrupted`` and :meth:`run` returns. ``cameras``, the task's declared cameras, says which images are
    depth (checked as float metres); without it every image must be RGB. ``control`` says who drives
    (stages/control.py); a driven job's ``make_policy`` builds one policy per row (policies keep state), called
    through the policy boundary (control.GuardedPolicy: a failing, exiting or hanging policy fails its attempt,
    named), and built again after a call that did not return.
    ``keep_failures``: a failed attempt of a kept kind (contract.KEEPABLE_FAILURES) ends with ``kept`` set, so
    its frames become an episode of their own; its slot is retried as after any failure.
    """

    def __init__(self, env: gym.Env | gym.vector.VectorEnv, *, task: str, job_seed: int = 0,
                 max_attempts: int = 3, interrupt: Callable[[], bool] | None = None, worker: int = 0,
                 cameras: tuple[CameraSpec, ...] | None = None, control: ControlSpec | None = None,
                 make_policy: Callable[[], Policy] | None = None, keep_failures: bool = False) -> None:
        self.retry = RetryPolicy(max_attempts)  # refuses max_attempts < 1 before anything is built
        self.rows = _Rows(env)
        self.task = task
        self.job_seed = job_seed
        self.max_attempts = max_attempts
        self.interrupt = interrupt or (lambda: False)
        self.worker = worker
        self._shapes = _Shapes()
        self._cameras = {c.name: c for c in cameras} if cameras is not None else None
        self._holds: list[np.ndarray | None] = [None] * self.rows.n
        if control is not None and control.driver is not None and make_policy is None:
            raise ValueError("a driven job needs make_policy")
        self.control = control
        self.keep_failures = keep_failures
        self._make_policy = make_policy
        self._policies: list[GuardedPolicy | None] = [None] * self.rows.n  # one per row: policies keep state

    def _policy(self, row: int) -> Policy | None:
        """The row's policy (built on first use, and again after one of its calls hung); a factory that fails
        is a :class:`PolicyError` that fails the attempt."""
        if self._make_policy is None or self.control is None or self.control.driver is None:
            return None
        policy = self._policies[row]
        if policy is None or policy.hung:
            driver = self.control.driver
            try:
                built = self._make_policy()
            except (PolicyError, KeyboardInterrupt):
                raise
            except BaseException as exc:
                raise PolicyError(f"building the policy {describe_failure(exc)}", driver=driver) from exc
            policy = self._policies[row] = GuardedPolicy(built, driver, self.control.policy_timeout_s)
        return policy

    def _hold_action(self, row: int) -> np.ndarray:
        holder = task_capability(self.rows.row_envs[row], HoldsAction)
        if holder is not None:
            return check_action(holder.demo_hold_action(), self.rows.action_space)
        cached = self._holds[row]
        if cached is None:
            cached = self._holds[row] = default_hold_action(self.rows.action_space)
        return cached

    def _start(self, slot: _RowSlot, attempt: int) -> AttemptStarted:
        """Reset the slot's row for ``attempt`` of its episode; a failing reset or plan ends the attempt."""
        assert slot.assignment is not None
        row = slot.index
        key = AttemptKey(slot.assignment.episode_index, attempt)
        seed = derive_seed(self.job_seed, key.episode_index, attempt)
        att = _Attempt(self.task, self.rows.row_envs[row], key, seed, row, self.rows.action_space, self._shapes,
                       self._cameras, self.control, self.keep_failures)
        slot.start(att)
        try:
            suite = task_capability(att.env, SelectsEpisode)
            if suite is not None:  # a suite: become the member this episode belongs to, named as its task
                att.task = str(att._task_call("demo_select_episode", suite.demo_select_episode, key.episode_index)
                               or self.task)
                att.bind_task()
            seeder = task_capability(att.env, SeedsAttempt)
            if seeder is not None:  # a task that plays recorded episodes back (rerender) keeps their seeds
                seed = att.seed = int(att._task_call("demo_attempt_seed", seeder.demo_attempt_seed, key.episode_index))
            randomizer = task_capability(att.env, Randomizes)
            if randomizer is not None:  # before the reset, so its first frame shows the drawn scene
                att.randomization = _draw_randomization(att, randomizer.demo_randomize, seed)
            try:
                obs, _info = self.rows.reset_row(row, seed)
            except DemoError:
                raise
            except Exception as exc:
                raise EnvError(f"reset(seed={seed}) raised {type(exc).__name__}: {exc}") from exc
            att.begin(obs, self._policy(row))
        except DemoError as exc:
            att.fail(exc)
        return AttemptStarted(key=key, seed=seed, row=row, worker=self.worker)

    def _settle(self, slot: _RowSlot, slots: list[_RowSlot], feed: _Feed) -> Iterator[Record]:
        """Emit the end of the slot's finished attempt, then start its retry or its next episode.

        Several records can come out: an attempt that fails at reset ends at once and is retried here.
        """
        while True:
            if slot.attempt is not None:
                if slot.attempt.result is None:
                    return
                ended = slot.end()
                yield ended
                result = ended.result
                if result.terminal_reason is TerminalReason.INTERRUPTED:
                    return
                if not result.committable:
                    assert slot.assignment is not None
                    then = self.retry.after(ended.key, result)
                    if isinstance(then, EpisodeAssignment):
                        yield self._start(slot, then.first_attempt)
                        continue
                    yield then
                slot.assignment = None
            if feed.exhausted:
                return
            # Block for work only when no other row has an episode to finish meanwhile.
            others_active = any(other.active for other in slots if other is not slot)
            assignment = feed.take(wait=not others_active)
            if assignment is None:
                return
            if assignment.first_attempt >= self.max_attempts:
                yield EpisodeAbandoned(assignment.episode_index, assignment.first_attempt,
                                       "attempts already exhausted")
                continue
            slot.assignment = assignment
            yield self._start(slot, assignment.first_attempt)

    def _step_rows(self, slots: list[_RowSlot], feed: _Feed) -> Iterator[Record]:
        """One env step of every row: active rows act and record, idle rows hold still."""
        actions: list[np.ndarray] = []
        for slot in slots:
            if slot.attempt is not None:
                try:
                    actions.append(slot.attempt.choose())
                except DemoError as exc:  # the driving policy failed: this attempt ends, the others step
                    slot.attempt.fail(exc)
                    actions.append(self._hold_action(slot.index))
            else:
                actions.append(self._hold_action(slot.index))
        try:
            outcomes = self.rows.step(actions)
        except Exception as exc:
            # One step call drives every row, so an env error fails every active row's attempt.
            cls = type(exc) if isinstance(exc, DemoError) else EnvError
            detail = exc.detail if isinstance(exc, DemoError) else f"step raised {type(exc).__name__}: {exc}"
            for slot in slots:
                if slot.attempt is not None:
                    slot.attempt.fail(cls(detail))
                    yield from self._settle(slot, slots, feed)
            return
        for slot, outcome in zip(slots, outcomes):
            if slot.attempt is not None and slot.attempt.result is not None:  # failed choosing its action
                yield from self._settle(slot, slots, feed)
                continue
            if slot.attempt is None:
                _obs, _reward, terminated, truncated, _info = outcome
                if terminated or truncated:
                    # A holding row ran into its env's step limit: reset it quietly (nothing of it is
                    # recorded), or stepping it again would step a finished episode.
                    self.rows.reset_row(slot.index, None)
                continue
            frame = slot.step(outcome)
            if frame is not None:
                yield frame
            yield from self._settle(slot, slots, feed)

    def run(self, work: WorkSource) -> Iterator[Record]:
        """Yield every record until the work runs dry (or ``interrupt``): refill idle rows, then step all."""
        slots = [_RowSlot(row) for row in range(self.rows.n)]
        feed = _Feed(work)
        while True:
            for slot in slots:
                if not slot.active and not feed.exhausted:
                    yield from self._settle(slot, slots, feed)  # refill idle rows
            if not any(slot.active for slot in slots):
                if feed.exhausted:
                    return
                continue
            if self.interrupt():
                for slot in slots:
                    if slot.attempt is not None:
                        slot.attempt.interrupt()
                        yield from self._settle(slot, slots, feed)
                return
            yield from self._step_rows(slots, feed)


def run_episodes(env: gym.Env | gym.vector.VectorEnv, *, task: str, episodes: int, job_seed: int = 0,
                 max_attempts: int = 3, cameras: tuple[CameraSpec, ...] | None = None,
                 layout: EpisodeLayout | None = None, control: ControlSpec | None = None,
                 make_policy: Callable[[], Policy] | None = None, keep_failures: bool = False) -> Iterator[Record]:
    """Convenience: run episodes ``0..episodes-1`` (of every member of a suite's ``layout``) and yield every
    record (``cameras``, ``control``, ``make_policy``, ``keep_failures``: see :class:`Executor`)."""
    yield from Executor(env, task=task, job_seed=job_seed, max_attempts=max_attempts, cameras=cameras,
                        control=control, make_policy=make_policy,
                        keep_failures=keep_failures).run(RangeWorkSource(episodes, layout=layout))
