"""The store's persistent schema as types: the job fingerprint, the camera description, attempt states.

A store keeps one :class:`Fingerprint` for life (JSON in the catalog's ``meta`` table); readers rebuild it
with :meth:`Fingerprint.from_json`, which refuses an old or foreign one with :class:`FingerprintError` naming
the field, and refuses names that would become paths outside the store.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from demoforge.storage.errors import StoreError
from demoforge.storage.names import TaskDefinitionError, check_name

SCHEMA_VERSION = 1
"""The version of the records a store and a dataset keep (episode records, fingerprints, sidecars)."""

ANNOTATION_KEYS = ("valid", "episode_step", "segment_id", "segment_step", "segment_start", "segment_end",
                   "terminated", "truncated")
"""Per-frame annotations, in stored order (staged arrays; exported as int64 ``annotation.<key>`` features)."""


class AttemptState(enum.StrEnum):
    """The catalog state of one attempt (see storage/catalog.py for the state machine)."""

    STAGING = "staging"
    COMMITTED = "committed"
    DISCARDED = "discarded"
    QUARANTINED = "quarantined"
    EXPORTED = "exported"


#: States of an attempt whose data is committed and readable (exported episodes stay in staging).
READABLE_STATES = (AttemptState.COMMITTED, AttemptState.EXPORTED)

#: Which committed episodes a reader takes (export, the samplers): ``episodes``, the job's own (each counts
#: toward ``--episodes``: an expert job's successes, a policy job's rollouts); ``failures``, the failed attempts
#: ``generate --keep-failures`` kept as data; ``all``, both.
INCLUDE_CHOICES = ("episodes", "failures", "all")


def check_include(value: str, what: str = "include") -> str:
    if value not in INCLUDE_CHOICES:
        raise ValueError(f"{what} {value!r}: expected one of {', '.join(INCLUDE_CHOICES)}")
    return value


def included(include: str, kept_failure: bool) -> bool:
    """Whether an episode (a kept failure or not) is one ``include`` takes."""
    return include == "all" or (include == "failures") == kept_failure


class FingerprintError(StoreError):
    """A stored job fingerprint is missing a field, has a field of the wrong type, or names an unsafe path."""


RGB, DEPTH = "rgb", "depth"
#: Camera kinds: ``rgb`` frames are (H, W, 3) uint8; ``depth`` frames are (H, W) float32 metres.
CAMERA_KINDS = (RGB, DEPTH)


@dataclass(frozen=True)
class CameraSpec:
    """One camera of a task: its name (a path component of staging and export), frame size and kind."""

    name: str
    height: int
    width: int
    kind: str = RGB

    @property
    def is_depth(self) -> bool:
        return self.kind == DEPTH

    @property
    def shape(self) -> tuple[int, ...]:
        """A recorded frame's shape: (height, width, 3) for RGB, (height, width) for depth."""
        return (self.height, self.width) if self.is_depth else (self.height, self.width, 3)

    @property
    def feature_shape(self) -> tuple[int, int, int]:
        """The LeRobot feature shape: (height, width, channels)."""
        return (self.height, self.width, 1 if self.is_depth else 3)

    def to_json(self) -> list[Any]:
        """``[name, height, width]`` for RGB (as stores have always recorded it), ``[..., "depth"]`` for depth."""
        return [self.name, self.height, self.width] + ([self.kind] if self.kind != RGB else [])


@dataclass(frozen=True)
class VideoIdentity:
    """The encoder settings that change a stored video's bytes (threads do not)."""

    codec: str
    crf: int | None
    preset: int | str | None
    g: int
    pix_fmt: str

    def to_json(self) -> dict[str, Any]:
        return {"codec": self.codec, "crf": self.crf, "preset": self.preset, "g": self.g, "pix_fmt": self.pix_fmt}


@dataclass(frozen=True)
class DepthVideoIdentity:
    """How depth cameras are quantized and encoded: LeRobot 0.6.1's ``DepthEncoderConfig`` fields.

    Recorded in the fingerprint (only when a job has depth cameras), so every episode of a store is decoded
    back to metres with the settings it was encoded with, whatever lerobot's defaults become later.
    """

    codec: str
    pix_fmt: str
    g: int | None
    crf: int | float | None
    preset: int | str | None
    extra_options: Mapping[str, Any]
    depth_min: float
    depth_max: float
    shift: float
    use_log: bool

    FIELDS = ("codec", "pix_fmt", "g", "crf", "preset", "extra_options", "depth_min", "depth_max", "shift",
              "use_log")

    def to_json(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v := getattr(self, k), Mapping) else v for k in self.FIELDS}

    @classmethod
    def from_json(cls, data: object) -> DepthVideoIdentity:
        if not isinstance(data, Mapping) or set(data) != set(cls.FIELDS) or \
                not isinstance(data["extra_options"], Mapping) or not isinstance(data["use_log"], bool) or \
                not all(isinstance(data[k], (int, float)) and not isinstance(data[k], bool)
                        for k in ("depth_min", "depth_max", "shift")):
            raise FingerprintError(f"the store's job fingerprint has a bad 'depth_video' field: expected an object "
                                   f"with {', '.join(cls.FIELDS)}, got {data!r}"[:400])
        return cls(codec=str(data["codec"]), pix_fmt=str(data["pix_fmt"]), g=data["g"], crf=data["crf"],
                   preset=data["preset"], extra_options=dict(data["extra_options"]),
                   depth_min=float(data["depth_min"]), depth_max=float(data["depth_max"]),
                   shift=float(data["shift"]), use_log=data["use_log"])


@dataclass(frozen=True)
class Fingerprint:
    """Everything that shapes stored data; a store refuses a job with a different one."""

    schema_version: int
    task: str
    task_options: Mapping[str, Any]
    fps: int
    cameras: tuple[CameraSpec, ...]
    state_shapes: Mapping[str, tuple[int, ...]]
    action_shape: tuple[int, ...]
    video: VideoIdentity
    seed: int
    chunk_frames: int
    depth_video: DepthVideoIdentity | None = None  # set exactly when a camera is a depth camera
    # How attempts were driven (stages/control.py ControlSpec.to_json), None when the expert drove alone
    control: Mapping[str, Any] | None = None
    # A rerender job's source and variants (pipeline/rerender.py RerenderSpec.to_json), None for generate
    rerender: Mapping[str, Any] | None = None
    keep_failures: bool = False  # failed attempts are kept as episodes of their own (generate --keep-failures)
    # Names of a 1-D feature's entries ("action", a state feature), as LeRobot features' "names" carry them: set by
    # tasks that record a real robot's features (so101-pick-place: "shoulder_pan.pos", ...); empty for the others
    feature_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    robot_type: str | None = None  # LeRobot's robot type for info.json; set with feature_names, None otherwise

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, exactly as stores have always recorded it (tuples as lists)."""
        raw = {"schema_version": self.schema_version, "task": self.task, "task_options": dict(self.task_options),
               "fps": self.fps, "cameras": [c.to_json() for c in self.cameras],
               "state_shapes": {k: list(v) for k, v in self.state_shapes.items()},
               "action_shape": list(self.action_shape), "video": self.video.to_json(), "seed": self.seed,
               "chunk_frames": self.chunk_frames}
        if self.depth_video is not None:  # absent for RGB-only jobs: their JSON is unchanged
            raw["depth_video"] = self.depth_video.to_json()
        if self.control is not None:  # absent for expert-only jobs, as before
            raw["control"] = dict(self.control)
        if self.rerender is not None:  # absent for generate jobs
            raw["rerender"] = dict(self.rerender)
        if self.keep_failures:  # absent unless failures are kept, as before
            raw["keep_failures"] = True
        if self.feature_names:  # absent for tasks without named features, as before
            raw["feature_names"] = {k: list(v) for k, v in self.feature_names.items()}
        if self.robot_type is not None:  # absent, as before, for tasks that do not name their robot's features
            raw["robot_type"] = self.robot_type
        return json.loads(json.dumps(raw, sort_keys=True))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fingerprint:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise FingerprintError(f"the store's job fingerprint is not JSON ({exc})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> Fingerprint:
        """The fingerprint a store's catalog holds, every field checked (FingerprintError names the first bad
        one: a store another version or program wrote, or a tampered one)."""
        if not isinstance(data, Mapping):
            raise FingerprintError(f"the store's job fingerprint is a {type(data).__name__}, not a JSON object")
        _check_fingerprint_fields(data)
        cameras, depth_video = _fingerprint_cameras(data)
        states = data["state_shapes"]
        if not isinstance(states, Mapping):
            raise _bad_field(data, "state_shapes", "expected an object of feature: shape")
        video = data["video"]
        if not isinstance(video, Mapping) or set(video) != {"codec", "crf", "preset", "g", "pix_fmt"}:
            raise _bad_field(data, "video", "expected an object with codec, crf, preset, g, pix_fmt")
        if not isinstance(data["task"], str) or not isinstance(data["task_options"], Mapping):
            raise _bad_field(data, "task" if not isinstance(data["task"], str) else "task_options", "wrong type")
        try:  # names from the catalog become paths: a tampered one must not lead a reader outside the store
            for c in cameras:
                check_name("camera", c[0])
            for feature in states:
                check_name("state feature", feature)
        except TaskDefinitionError as exc:
            raise FingerprintError(f"the store's job fingerprint is unsafe: {exc}") from None
        schema_version = _int_field(data, "schema_version", data["schema_version"])  # checked in this order
        fps = _int_field(data, "fps", data["fps"], 1)
        state_shapes = {k: _shape_field(data, "state_shapes", v) for k, v in states.items()}
        action_shape = _shape_field(data, "action_shape", data["action_shape"])
        return cls(schema_version=schema_version, task=data["task"], task_options=dict(data["task_options"]),
                   fps=fps, cameras=tuple(CameraSpec(*c) for c in cameras), state_shapes=state_shapes,
                   action_shape=action_shape,
                   video=VideoIdentity(codec=str(video["codec"]), crf=video["crf"], preset=video["preset"],
                                       g=_int_field(data, "video", video["g"], 1), pix_fmt=str(video["pix_fmt"])),
                   seed=_int_field(data, "seed", data["seed"]),
                   chunk_frames=_int_field(data, "chunk_frames", data["chunk_frames"], 1),
                   depth_video=depth_video, control=_control_field(data.get("control")),
                   rerender=_rerender_field(data.get("rerender")),
                   keep_failures=_keep_failures_field(data.get("keep_failures")),
                   feature_names=_feature_names_field(data.get("feature_names"),
                                                      {**state_shapes, "action": action_shape}),
                   robot_type=_robot_type_field(data.get("robot_type")))

    def differences(self, other: Fingerprint) -> list[str]:
        """Each differing field, as 'field: store has X, this job has Y' (self is the store's)."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: store has {mine.get(k)!r}, this job has {theirs.get(k)!r}"
                for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]


def check_feature_names(names: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, ...]]:
    """``names`` as feature -> tuple of entry names; each must name a 1-D feature of ``shapes``, one distinct
    non-empty string per entry. Raises ValueError saying which is wrong."""
    checked: dict[str, tuple[str, ...]] = {}
    for feature, entries in names.items():
        shape = shapes.get(feature)
        if shape is None or len(shape) != 1:
            raise ValueError(f"names are given for {feature!r}, which is not a 1-D feature of this task")
        if isinstance(entries, str) or not all(isinstance(e, str) and e for e in entries) \
                or len(entries) != shape[0] or len(set(entries)) != len(entries):
            raise ValueError(f"{feature!r} needs {shape[0]} distinct non-empty names, got {entries!r}"[:300])
        checked[feature] = tuple(entries)
    return checked


def _feature_names_field(value: object, shapes: Mapping[str, tuple[int, ...]]) -> Mapping[str, tuple[str, ...]]:
    if value is None:
        return {}
    try:
        if not isinstance(value, Mapping):
            raise ValueError("expected an object of feature: [names]")
        return check_feature_names(value, shapes)
    except ValueError as exc:
        raise FingerprintError(f"the store's job fingerprint has a bad 'feature_names' field: {exc}"[:400]) from None


def _robot_type_field(value: object) -> str | None:
    if value is not None and not (isinstance(value, str) and value and len(value) <= 100):
        raise FingerprintError(f"the store's job fingerprint has a bad 'robot_type' field, got {value!r}"[:400])
    return value


def _keep_failures_field(value: object) -> bool:
    if value is None:
        return False
    if value is not True:
        raise FingerprintError(f"the store's job fingerprint has a bad 'keep_failures' field, got {value!r}"[:400])
    return True


def _rerender_field(value: object) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"source", "variants"} or \
            not isinstance(value["source"], str) or not isinstance(value["variants"], int):
        raise FingerprintError(f"the store's job fingerprint has a bad 'rerender' field, got {value!r}"[:400])
    return dict(value)


def _check_fingerprint_fields(data: Mapping[str, Any]) -> None:
    """Every field a fingerprint must have, and none this version does not know."""
    wanted = ("schema_version", "task", "task_options", "fps", "cameras", "state_shapes", "action_shape",
              "video", "seed", "chunk_frames")
    missing = [k for k in wanted if k not in data]
    extra = sorted(set(data) - set(wanted) - {"depth_video", "control", "rerender", "keep_failures",
                                               "feature_names", "robot_type"})
    if missing or extra:
        raise FingerprintError("the store's job fingerprint was written by another version or program: "
                               + "; ".join([*(f"field {k!r} is missing" for k in missing),
                                            *(f"field {k!r} is unknown" for k in extra)]))


def _bad_field(data: Mapping[str, Any], name: str, what: str) -> FingerprintError:
    return FingerprintError(f"the store's job fingerprint has a bad {name!r} field: {what}, got {data[name]!r}"[:400])


def _int_field(data: Mapping[str, Any], name: str, value: object, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise _bad_field(data, name, f"expected an integer >= {lo}")
    return value


def _shape_field(data: Mapping[str, Any], name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                              for d in value):
        raise _bad_field(data, name, "expected a list of positive integers")
    return tuple(value)


def _fingerprint_cameras(data: Mapping[str, Any]) -> tuple[list[list[Any]], DepthVideoIdentity | None]:
    """The cameras ([name, height, width], ``"depth"`` appended for a depth camera) and, with depth cameras
    only, how their depth is encoded."""
    cameras = data["cameras"]
    if not isinstance(cameras, list) or not all(
            isinstance(c, list) and (len(c) == 3 or (len(c) == 4 and c[3] in CAMERA_KINDS and c[3] != RGB))
            and isinstance(c[1], int) and isinstance(c[2], int) for c in cameras):
        raise _bad_field(data, "cameras",
                         "expected a list of [name, height, width] or [name, height, width, \"depth\"]")
    depth_video = DepthVideoIdentity.from_json(data["depth_video"]) if "depth_video" in data else None
    if (depth_video is None) != all(len(c) == 3 for c in cameras):
        raise FingerprintError("the store's job fingerprint has depth cameras without a 'depth_video' field, or "
                               "the other way round")
    return cameras, depth_video


def _control_field(value: object) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not set(value) <= {"driver", "beta", "noise", "takeover"}:
        raise FingerprintError(f"the store's job fingerprint has a bad 'control' field, got {value!r}"[:400])
    return dict(value)
