"""A durable recorder with LeRobot's call shape, for recording loops demoforge does not drive.

``Recorder.create(root, fps=..., features=...)``, then ``add_frame`` / ``save_episode`` / ``discard_episode`` /
``close``, as with ``LeRobotDataset.create``. Frames go through the pipeline's own stages (streaming encode,
Zarr staging, commit), run by an event loop in a thread of their own: ``add_frame`` blocks when the stages are
behind (nothing is dropped; memory is bounded by ``queue_frames``), and ``save_episode`` returns once the
episode is committed (fsynced, then flipped in the catalog), so a kill after it returns loses nothing.

The staging store is ``<root>.store`` beside the dataset; the LeRobot dataset at ``root`` is published from it
atomically (a new version, then one link swap) on every save, every K saves, or only at close.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.from_thread
import numpy as np
from anyio.streams.memory import MemoryObjectSendStream

from demoforge.pipeline.environment import prepare_process
from demoforge.pipeline.tasks.registry import TaskInfo, check_task_info
from demoforge.stages.commit import commit_stage
from demoforge.stages.context import StageContext
from demoforge.stages.contract import Annotations, EpisodeResult, SegmentResult, TerminalReason
from demoforge.stages.encode import encode_stage
from demoforge.stages.records import (
    AttemptEnded,
    AttemptKey,
    AttemptStarted,
    EncodedRecord,
    Frame,
    Record,
    StagedAttempt,
    StagedRecord,
)
from demoforge.stages.settings import JobConfigError, VideoSettings
from demoforge.stages.write import write_stage
from demoforge.storage.catalog import JobMismatchError
from demoforge.storage.errors import StoreError
from demoforge.storage.lerobot.format import (
    AUTOMATIC_COLUMNS,
    LANGUAGE_FEATURES,
    OUTCOME_COLUMNS,
    annotation_key,
    camera_key,
)
from demoforge.storage.names import TaskDefinitionError
from demoforge.storage.schema import ANNOTATION_KEYS, SCHEMA_VERSION, CameraSpec, Fingerprint
from demoforge.storage.store import Store, open_store

#: The fingerprint's task name of every recorder store (the episodes' own task strings are their instructions).
RECORDER_TASK = "recorder"
#: The segment of frames added without ``segment=``.
DEFAULT_SEGMENT = "episode"
#: The longest ``task`` or ``instruction=`` text (characters): one cap for every language string a frame carries.
MAX_TEXT_CHARS = 1000
_CAMERA_PREFIX = camera_key("")  # "observation.images."
#: Columns demoforge writes itself: a recorder's features may not declare them.
_RESERVED = frozenset({*AUTOMATIC_COLUMNS, *OUTCOME_COLUMNS, *LANGUAGE_FEATURES, "next.reward", "task",
                       *(annotation_key(k) for k in ANNOTATION_KEYS)})

Publish = Literal["save", "close"] | int


class RecorderError(ValueError):
    """Bad input to a recorder: a feature, a frame, a call out of order. Nothing committed is altered."""


class FrameError(RecorderError):
    """A frame does not match the recorder's features (a missing or extra key, a shape, a dtype, the task)."""


class RecorderClosedError(RecorderError):
    """The recorder was closed (or failed); it takes no more frames."""


class RecorderMismatchError(RecorderError):
    """The root belongs to another recording: other features, fps, codec or robot type."""


class RecorderFailedError(RuntimeError):
    """The recorder's stages failed (an encoder, the disk): a durability error. Episodes whose ``save_episode``
    returned are committed; the episode in progress is lost."""


@dataclass(frozen=True)
class RecorderFeatures:
    """A LeRobot feature dict, as the stages record it: cameras, state features (every other numeric feature, in
    the user's order) and the action."""

    cameras: tuple[CameraSpec, ...]
    state_shapes: Mapping[str, tuple[int, ...]]
    action_shape: tuple[int, ...]
    names: Mapping[str, tuple[str, ...]]

    @classmethod
    def parse(cls, features: Mapping[str, Mapping[str, Any]]) -> RecorderFeatures:
        if not isinstance(features, Mapping) or not features:
            raise RecorderError("features: expected LeRobot's feature dict (name -> {'dtype', 'shape', 'names'})")
        cameras: list[CameraSpec] = []
        states: dict[str, tuple[int, ...]] = {}
        names: dict[str, tuple[str, ...]] = {}
        action: tuple[int, ...] | None = None
        for key, spec in features.items():
            if key in _RESERVED:
                raise RecorderError(f"feature {key!r}: demoforge writes this column itself; leave it out of the "
                                    "features (the task string goes in each frame's 'task')")
            if not isinstance(spec, Mapping) or "dtype" not in spec or "shape" not in spec:
                raise RecorderError(f"feature {key!r}: expected a dict with 'dtype' and 'shape', got {spec!r}"[:300])
            dtype, shape = spec["dtype"], tuple(spec["shape"])
            if dtype in ("video", "image"):
                if not key.startswith("observation.") or len(shape) != 3 or shape[2] != 3:
                    raise RecorderError(f"feature {key!r}: a camera is named '{_CAMERA_PREFIX}<name>' (or "
                                        f"'observation.<name>') with shape (height, width, 3); got shape {shape}")
                name = key[len(_CAMERA_PREFIX):] if key.startswith(_CAMERA_PREFIX) else key
                cameras.append(CameraSpec(name, int(shape[0]), int(shape[1])))
                continue
            if dtype != "float32":
                raise RecorderError(f"feature {key!r}: dtype {dtype!r} is not recorded; the recorder takes float32 "
                                    "numeric features and RGB cameras ('video' or 'image', stored as video)")
            if not shape or not all(isinstance(n, int) and n > 0 for n in shape):
                raise RecorderError(f"feature {key!r}: shape {shape} must be positive integers")
            entry_names = _entry_names(key, shape, spec.get("names"))
            if entry_names is not None:
                names[key] = entry_names
            if key == "action":
                action = shape
            else:
                states[key] = shape
        if action is None:
            raise RecorderError("features: an 'action' feature (float32) is required, as LeRobot's policies train "
                                "on it")
        parsed = cls(cameras=tuple(cameras), state_shapes=states, action_shape=action, names=names)
        try:
            check_task_info(parsed.task_info(fps=30))
        except TaskDefinitionError as exc:
            raise RecorderError(f"features: {exc}") from None
        return parsed

    def task_info(self, fps: int) -> TaskInfo:
        return TaskInfo(name=RECORDER_TASK, description="frames recorded by a user's loop", instruction="",
                        fps=fps, action_shape=self.action_shape, state_shapes=dict(self.state_shapes),
                        cameras=self.cameras, segment_names=(), feature_names=dict(self.names))

    def numbers(self, frame: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
        """(states, action, images) of one frame, checked against the features; :class:`FrameError` otherwise."""
        expected = {*self.state_shapes, "action", *(camera_key(c.name) for c in self.cameras)}
        given = set(frame) - {"task"}
        if given != expected:
            missing, extra = sorted(expected - given), sorted(given - expected)
            raise FrameError("frame keys do not match the features: " + "; ".join(
                part for part in (f"missing {missing}" if missing else "",
                                  f"not in the features {extra}" if extra else "") if part))
        states = {k: _numeric(k, frame[k], shape) for k, shape in self.state_shapes.items()}
        action = _numeric("action", frame["action"], self.action_shape)
        images = {}
        for camera in self.cameras:
            key = camera_key(camera.name)
            image = frame[key]
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.shape != camera.shape:
                got = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
                raise FrameError(f"frame[{key!r}]: expected a uint8 array of shape {camera.shape} (height, width, "
                                 f"RGB), got {got}")
            images[camera.name] = image
        return states, action, images


def _entry_names(key: str, shape: tuple[int, ...], names: Any) -> tuple[str, ...] | None:
    """A numeric feature's ``names``: None, or one distinct non-empty string per entry of a 1-D feature. Anything
    else is refused rather than dropped: the dataset would silently lack names its features dict promised."""
    if names is None:
        return None
    if len(shape) != 1:
        raise RecorderError(f"feature {key!r}: names are recorded for 1-D features only (shape {shape}); give "
                            "'names': None")
    if not isinstance(names, (list, tuple)) or len(names) != shape[0] or \
            not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise RecorderError(f"feature {key!r}: 'names' must be None or {shape[0]} distinct non-empty strings (one "
                            f"per entry of shape {shape}), got {names!r}"[:300])
    return tuple(names)


def _text(what: str, value: Any) -> None:
    """Refuse a language string (the task, an instruction) that is not a non-empty string of at most
    ``MAX_TEXT_CHARS``: it is written into the episode's record and its language columns."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT_CHARS:
        shown = f"{len(value)} characters" if isinstance(value, str) and len(value) > MAX_TEXT_CHARS else repr(value)
        raise FrameError(f"{what}: expected a non-empty string of at most {MAX_TEXT_CHARS} characters, got "
                         f"{shown}"[:300])


def _numeric(key: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(value)
    if array.shape != shape and not (array.shape == () and shape == (1,)):
        raise FrameError(f"frame[{key!r}]: expected shape {shape}, got {array.shape}")
    if array.dtype.kind not in "fiu":
        raise FrameError(f"frame[{key!r}]: expected numbers (float32), got dtype {array.dtype}")
    out = array.astype(np.float32).reshape(shape)
    if not np.all(np.isfinite(out)):
        raise FrameError(f"frame[{key!r}]: holds NaN or infinite values")
    return out


@dataclass
class _Held:
    """The newest frame, kept back one call: whether it ends its segment is known only from the next one."""

    states: dict[str, np.ndarray]
    action: np.ndarray
    images: dict[str, np.ndarray]
    reward: float
    segment: str
    step: int
    segment_id: int
    segment_step: int


class _Outcomes:
    """What ``commit_stage`` reports, turned into futures the caller's thread waits on (the planner's place)."""

    def __init__(self) -> None:
        self._waiting: dict[AttemptKey, concurrent.futures.Future[StagedAttempt]] = {}
        self._lock = threading.Lock()

    def expect(self, key: AttemptKey) -> concurrent.futures.Future[StagedAttempt]:
        with self._lock:
            future = self._waiting[key] = concurrent.futures.Future()
        return future

    def outcome(self, item: StagedAttempt) -> None:
        with self._lock:
            future = self._waiting.pop(item.ended.key, None)
        if future is not None:
            future.set_result(item)

    def fail_all(self, exc: BaseException) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            future.set_exception(exc)

    # the planner's part of commit_stage's contract: a recorder has no target to plan toward
    def finished(self, episode_index: int, committed: bool, last_error: str = "") -> None:
        pass

    def attempt_discarded(self, reason: str, episode_index: int = 0) -> None:
        pass


class Recorder:
    """A durable LeRobot-style recorder. Use :meth:`create`; one recorder per root at a time (a lock)."""

    def __init__(self, root: Path, store: Store, features: RecorderFeatures, fingerprint: Fingerprint,
                 settings: VideoSettings, publish: Publish, repo_id: str, queue_frames: int) -> None:
        self.root, self.store_dir = root, store.path
        self.features, self.fingerprint = features, fingerprint
        self._store, self._settings, self._publish, self._repo_id = store, settings, publish, repo_id
        self._outcomes = _Outcomes()
        self._closed = False
        self._failure: BaseException | None = None
        self._held: _Held | None = None
        self._key: AttemptKey | None = None
        self._task: str | None = None
        # (name, start step, instruction, target) of each segment in this episode
        self._segments: list[tuple[str, int, str | None, str | None]] = []
        self._unpublished = 0
        self.saved = 0  # episodes this recorder saved
        committed = store.committed()
        self._next_index = max((r.episode_index for r in committed if not r.kept_failure), default=-1) + 1
        # attempts a crash or a discard already spent on that index (their rows stay, discarded)
        self._attempt = sum(1 for r in store.attempts() if r.episode_index == self._next_index)
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._send: MemoryObjectSendStream[Record] | None = None
        started = threading.Event()
        self._pipeline = self._portal.start_task_soon(self._run, queue_frames, started)
        started.wait()

    # ----------------------------------------------------------------------------------------- creating
    @classmethod
    def create(cls, root: Path | str, *, fps: int, features: Mapping[str, Mapping[str, Any]],
               robot_type: str | None = None, codec: str = "libsvtav1", publish: Publish = "save",
               repo_id: str | None = None, queue_frames: int = 32, chunk_frames: int = 64) -> Recorder:
        """Open the recorder at ``root`` (the LeRobot dataset; frames are staged in ``<root>.store``): a new one,
        or the one a previous run left there, which it continues (same features, fps, codec and robot type; its
        episode in progress, if a crash left one, is discarded).

        ``publish``: ``"save"`` publishes the dataset after every ``save_episode``, an integer K after every K
        saves, ``"close"`` only at :meth:`close`. ``codec``: LeRobot's default AV1 (``libsvtav1``), ``h264`` or
        ``hevc``.
        """
        prepare_process()
        root = Path(root)
        parsed = RecorderFeatures.parse(features)
        if publish not in ("save", "close") and not (isinstance(publish, int) and not isinstance(publish, bool)
                                                    and publish >= 1):
            raise RecorderError(f"publish={publish!r}: expected 'save', 'close' or a number of saves >= 1")
        if not isinstance(fps, int) or isinstance(fps, bool) or not 1 <= fps <= 1000:
            raise RecorderError(f"fps={fps!r}: expected an integer in 1..1000")
        if not 1 <= queue_frames <= 100_000:
            raise RecorderError(f"queue_frames={queue_frames!r}: expected 1..100000")
        try:
            settings = VideoSettings(codec=codec)
        except JobConfigError as exc:
            raise RecorderError(f"codec: {exc}") from None
        fingerprint = Fingerprint(schema_version=SCHEMA_VERSION, task=RECORDER_TASK, task_options={}, fps=fps,
                                  cameras=parsed.cameras, state_shapes=dict(parsed.state_shapes),
                                  action_shape=parsed.action_shape, video=settings.identity(), seed=0,
                                  chunk_frames=chunk_frames, feature_names=dict(parsed.names),
                                  robot_type=robot_type)
        store_dir = root.with_name(root.name + ".store")
        if (root.exists() or root.is_symlink()) and not store_dir.exists():
            raise RecorderMismatchError(f"{root} exists and no recorder staged it (no {store_dir.name} beside it): "
                                        "record into a new folder (a LeRobot dataset is never overwritten)")
        try:
            store = open_store(store_dir, "w", fingerprint=fingerprint)
        except JobMismatchError as exc:
            raise RecorderMismatchError(f"{root} was recorded with other settings: {exc}") from None
        except StoreError as exc:
            raise RecorderError(str(exc)) from None
        recorder = cls(root, store, parsed, fingerprint, settings, publish, repo_id or f"demoforge/{root.name}",
                       queue_frames)
        if not store.created and store.committed():
            recorder.publish()  # a run killed between a commit and its publish: the dataset catches up
        return recorder

    # ----------------------------------------------------------------------------------------- the loop
    @property
    def episode_index(self) -> int:
        """The store index the episode being recorded (or the next one) gets."""
        return self._next_index

    @property
    def frames_in_episode(self) -> int:
        return 0 if self._held is None else self._held.step + 1

    def add_frame(self, frame: Mapping[str, Any], *, segment: str | None = None, instruction: str | None = None,
                  reward: float = 0.0, target: str | None = None) -> None:
        """Add one frame (every feature, and ``task``: the episode's instruction). ``segment`` names the
        sub-trajectory it belongs to (reach, grasp, ...; consecutive frames of one name are one segment, with
        ``instruction`` as its language and ``target`` as the object it acts on, both taken from its first
        frame); ``reward`` is recorded as ``next.reward``. Blocks while the stages are behind."""
        self._check_open()
        if not isinstance(frame, Mapping):
            raise FrameError(f"a frame is a dict of feature name -> value, got {type(frame).__name__}")
        task = frame.get("task")
        _text("frame['task'] (the episode's instruction)", task)
        if instruction is not None:
            _text("instruction", instruction)
        if self._task is not None and task != self._task:
            raise FrameError(f"frame['task'] changed within an episode ({self._task!r} -> {task!r}); one episode has "
                             "one task: name its parts with segment=")
        name = DEFAULT_SEGMENT if segment is None else segment
        if not isinstance(name, str) or not name or len(name) > 200:
            raise FrameError(f"segment={segment!r}: expected a non-empty name of at most 200 characters")
        if target is not None and (not isinstance(target, str) or not target or len(target) > 200):
            raise FrameError(f"target={target!r}: expected None or a non-empty name of at most 200 characters")
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise FrameError(f"reward={reward!r}: expected a finite number")
        states, action, images = self.features.numbers(frame)
        held = self._held
        if held is None:
            self._task = task
            key = self._key = AttemptKey(self._next_index, self._attempt)
            self._send_record(AttemptStarted(key, seed=0, row=0))
            step, segment_id, segment_step = 0, 0, 0
            self._segments = [(name, 0, instruction, target)]
        else:
            step = held.step + 1
            if name == held.segment:
                segment_id, segment_step = held.segment_id, held.segment_step + 1
            else:
                segment_id, segment_step = held.segment_id + 1, 0
                self._segments.append((name, step, instruction, target))
            self._emit(held, segment_end=segment_step == 0, last=False)
        self._held = _Held(states, action, images, float(reward), name, step, segment_id, segment_step)

    def save_episode(self) -> int:
        """Commit the episode: returns (its store index) once it is durable, then publishes as ``publish`` says."""
        self._check_open()
        held, key = self._held, self._key
        if held is None or key is None:
            raise RecorderError("save_episode: no frame was added since the last save or discard")
        future = self._outcomes.expect(key)
        self._emit(held, segment_end=True, last=True)
        frames = held.step + 1
        segments = tuple(SegmentResult(i, name, start, end, True, instruction=instruction, target=target)
                         for i, ((name, start, instruction, target), end) in enumerate(
                             zip(self._segments, [s[1] for s in self._segments[1:]] + [frames])))
        result = EpisodeResult(task=RECORDER_TASK, episode_index=key.episode_index, attempt=key.attempt, seed=0,
                               row=0, length=frames, completed=True, success=True, terminated=True, truncated=False,
                               terminal_reason=TerminalReason.SUCCESS, segments=segments, instruction=self._task)
        self._send_record(AttemptEnded(key, result, frames))
        self._wait(future)
        self._reset_episode()
        self._next_index += 1
        self._attempt = 0
        self.saved += 1
        self._unpublished += 1
        if self._publish == "save" or (isinstance(self._publish, int) and self._unpublished >= self._publish):
            self.publish()
        return key.episode_index

    def discard_episode(self) -> None:
        """Drop the episode in progress: its frames and videos are deleted, nothing of it is exported."""
        self._check_open()
        held, key = self._held, self._key
        if held is None or key is None:
            self._reset_episode()
            return
        future = self._outcomes.expect(key)
        self._emit(held, segment_end=True, last=True)
        self._send_record(AttemptEnded(key, _discarded(key, held.step + 1, self._task), held.step + 1))
        self._wait(future)
        self._reset_episode()
        self._attempt += 1

    def publish(self) -> Any:
        """Publish every saved episode not yet in the dataset at ``root`` (one atomic new version); returns the
        export's report."""
        if self._failure is not None:
            raise RecorderFailedError(f"not published: {self._failure}")
        from demoforge.storage.lerobot.export import export_store

        report = export_store(self.store_dir, self.root, repo_id=self._repo_id)
        self._unpublished = 0
        return report

    def close(self) -> None:
        """Discard an episode in progress (unsaved), publish what was saved, stop the stages, release the root."""
        if self._closed:
            return
        try:
            if self._failure is None:
                if self._held is not None:
                    self.discard_episode()
                if self._unpublished or self._publish == "close":
                    self.publish()
        finally:
            self._closed = True
            self._shutdown()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ async callers
    async def add_frame_async(self, frame: Mapping[str, Any], **kwargs: Any) -> None:
        """:meth:`add_frame` from async code: waits in a worker thread, so the caller's event loop runs on."""
        await anyio.to_thread.run_sync(functools.partial(self.add_frame, frame, **kwargs))

    async def save_episode_async(self) -> int:
        return await anyio.to_thread.run_sync(self.save_episode)

    async def discard_episode_async(self) -> None:
        await anyio.to_thread.run_sync(self.discard_episode)

    async def close_async(self) -> None:
        await anyio.to_thread.run_sync(self.close)

    # ----------------------------------------------------------------------------------------- inside
    def _reset_episode(self) -> None:
        self._held, self._key, self._task, self._segments = None, None, None, []

    def _check_open(self) -> None:
        if self._failure is not None:
            raise RecorderFailedError(self._failure_message())
        if self._closed:
            raise RecorderClosedError("the recorder is closed; open the root again with Recorder.create to go on")

    def _failure_message(self) -> str:
        return (f"the recorder's stages failed: {self._failure}. Episodes saved before are committed in "
                f"{self.store_dir} and published at {self.root} (run Recorder.create on the root again to publish any "
                "that were not); the episode in progress is lost")

    def _emit(self, held: _Held, *, segment_end: bool, last: bool) -> None:
        assert self._key is not None
        annotations = Annotations(episode_step=held.step, segment_id=held.segment_id, segment_step=held.segment_step,
                                  segment_start=held.segment_step == 0, segment_end=segment_end, terminated=last,
                                  truncated=False)
        self._send_record(Frame(self._key, held.step, held.states, held.action, held.reward, annotations,
                                held.images))

    def _send_record(self, record: Record) -> None:
        send = self._send
        assert send is not None
        try:
            self._portal.call(send.send, record)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._raise_failure()

    def _wait(self, future: concurrent.futures.Future[StagedAttempt]) -> None:
        while True:
            try:
                future.result(timeout=0.5)
                return
            except concurrent.futures.TimeoutError:
                if self._pipeline.done():
                    self._raise_failure()
            except Exception:
                self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is None and self._pipeline.done():
            self._failure = self._pipeline.exception() or RuntimeError("the recorder's stages stopped")
        if self._failure is None:
            self._failure = RuntimeError("the recorder's stages stopped")
        raise RecorderFailedError(self._failure_message()) from self._failure

    async def _run(self, queue_frames: int, started: threading.Event) -> None:
        store = self._store
        context = StageContext()
        q = queue_frames
        front_send, front_recv = anyio.create_memory_object_stream[Record](q)
        enc_send, enc_recv = anyio.create_memory_object_stream[EncodedRecord](q)
        write_send, write_recv = anyio.create_memory_object_stream[StagedRecord](q)
        self._send = front_send
        started.set()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(encode_stage, front_recv, enc_send, cameras=self.features.cameras,
                                                fps=self.fingerprint.fps, settings=self._settings, context=context,
                                                stats_dir=self.store_dir))
                tg.start_soon(functools.partial(write_stage, enc_recv, write_send, store=store, context=context))
                await commit_stage(write_recv, store=store, planner=self._outcomes, on_outcome=self._outcomes.outcome, context=context)
        except BaseException as exc:
            self._failure = exc
            self._outcomes.fail_all(exc)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(store.release_unfinished)
            raise

    def _shutdown(self) -> None:
        send = self._send
        if send is not None:
            with contextlib.suppress(Exception):
                self._portal.call(send.close)
        with contextlib.suppress(BaseException):
            self._pipeline.result(timeout=600)
        with contextlib.suppress(BaseException):
            self._portal_cm.__exit__(None, None, None)
        self._store.close()


def _discarded(key: AttemptKey, frames: int, task: str | None) -> EpisodeResult:
    return EpisodeResult(task=RECORDER_TASK, episode_index=key.episode_index, attempt=key.attempt, seed=0, row=0,
                         length=frames, completed=False, success=False, terminated=False, truncated=False,
                         terminal_reason=TerminalReason.INTERRUPTED, segments=(), instruction=task,
                         error="discarded by the recorder's caller")

