"""Built-in tasks under stable names, with the static facts a job and an export need about them.

A task entry builds its env from options (validated here: unknown keys and wrong types are refused with
the key named) and describes the frames it records, so ``demoforge tasks`` and a job's fingerprint do not
need to start a simulator.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from demoforge.storage.schema import CameraSpec  # the one camera description (tasks, fingerprint, staging, export)


class UnknownTaskError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class TaskOptionError(ValueError):
    """A task option is unknown or has the wrong type or range."""


class TaskDefinitionError(ValueError):
    """A task describes something a job cannot store: an unsafe camera or feature name, or sizes beyond the
    job limits (refused before anything is allocated or written)."""


# Camera and state-feature names become directory and file names (staging arrays, video paths of the
# export): one path component of safe characters, never ".." or a hidden name.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# Job limits on what one frame may hold, whatever a task's own option checks allow.
MAX_CAMERA_SIDE = 4096
MAX_CAMERAS = 16
MAX_FEATURE_VALUES = 1 << 20
MAX_FPS = 1000


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a safe camera / feature name, else raise :class:`TaskDefinitionError`."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise TaskDefinitionError(f"{kind} name {name!r} is not allowed: use 1-64 characters of A-Z a-z 0-9 _ . - "
                                  "starting with a letter, digit or underscore, without '..'")
    return name


def check_task_info(info: TaskInfo) -> TaskInfo:
    """Refuse a task description whose names could escape a directory or whose sizes exceed the job limits."""
    where = f"task {info.name!r}"
    try:
        if not _is_int(info.fps) or not 1 <= info.fps <= MAX_FPS:
            raise TaskDefinitionError(f"fps must be an integer in 1..{MAX_FPS}, got {info.fps!r}")
        if len(info.cameras) > MAX_CAMERAS:
            raise TaskDefinitionError(f"{len(info.cameras)} cameras; the job limit is {MAX_CAMERAS}")
        seen: set[str] = set()
        for camera in info.cameras:
            check_name("camera", camera.name)
            if camera.name in seen:
                raise TaskDefinitionError(f"camera {camera.name!r} is declared twice")
            seen.add(camera.name)
            for side in (camera.height, camera.width):
                if not _is_int(side) or not 1 <= side <= MAX_CAMERA_SIDE:
                    raise TaskDefinitionError(f"camera {camera.name!r} is {camera.height!r}x{camera.width!r}; "
                                              f"the job limit is 1..{MAX_CAMERA_SIDE} pixels a side")
        shapes = {**{f"state feature {k!r}": v for k, v in info.state_shapes.items()}, "action": info.action_shape}
        for feature in info.state_shapes:
            check_name("state feature", feature)
        for what, shape in shapes.items():
            dims = tuple(shape)
            if not all(_is_int(d) and d >= 1 for d in dims) or \
                    math.prod(dims) > MAX_FEATURE_VALUES:
                raise TaskDefinitionError(f"{what} has shape {dims!r}; dimensions must be positive integers with "
                                          f"at most {MAX_FEATURE_VALUES} values in all")
    except TaskDefinitionError as exc:
        raise TaskDefinitionError(f"{where}: {exc}") from None
    return info


@dataclass(frozen=True)
class TaskInfo:
    """What one configured task records: feature shapes, cameras, rate and segment vocabulary."""

    name: str
    description: str
    instruction: str
    fps: int
    action_shape: tuple[int, ...]
    state_shapes: Mapping[str, tuple[int, ...]]
    cameras: tuple[CameraSpec, ...]
    segment_names: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    action_names: tuple[str, ...] | None = None
    robot_type: str | None = None


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its defaults, how to describe it and how to build its env for given options."""

    name: str
    defaults: Mapping[str, Any]
    describe: Callable[[Mapping[str, Any]], TaskInfo]
    make_env: Callable[[Mapping[str, Any]], gym.Env]
    check: Callable[[Mapping[str, Any]], None] | None = None

    def resolve_options(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overlaid with ``options``; unknown keys or values of the wrong type are refused."""
        merged = dict(self.defaults)
        for key, value in (options or {}).items():
            if key not in self.defaults:
                raise TaskOptionError(f"task {self.name!r} has no option {key!r}; known options: "
                                      f"{', '.join(sorted(self.defaults)) or 'none'}")
            default = self.defaults[key]
            if isinstance(default, bool) != isinstance(value, bool) or (
                    not isinstance(value, type(default)) and not (isinstance(default, float)
                                                                   and isinstance(value, int))):
                raise TaskOptionError(f"task {self.name!r} option {key!r} must be {type(default).__name__}, "
                                      f"got {value!r}")
            merged[key] = float(value) if isinstance(default, float) else value
        if self.check is not None:
            self.check(merged)
        return merged

    def info(self, options: Mapping[str, Any] | None = None) -> TaskInfo:
        """The task's description for these options, checked: safe names, sizes within the job limits."""
        return check_task_info(self.describe(self.resolve_options(options)))

    def build(self, options: Mapping[str, Any] | None = None) -> gym.Env:
        self.info(options)  # refuse an unsafe or oversized description before the env allocates anything
        return self.make_env(self.resolve_options(options))


# Built-in tasks are imported on first use: each pulls in a simulator.
_BUILTIN_MODULES = {
    "fetch-pick-place": "demoforge.pipeline.tasks.fetch_pick_place",
    "aloha-transfer-cube": "demoforge.pipeline.tasks.aloha_transfer_cube",
}
_REGISTRY: dict[str, TaskEntry] = {}
DEFAULT_TASK = "fetch-pick-place"


def register(entry: TaskEntry) -> TaskEntry:
    """Register a task (built-ins call this at import; tests and users may register their own)."""
    existing = _REGISTRY.get(entry.name)
    if existing is not None and existing is not entry:
        raise ValueError(f"task {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


def _load_plugins() -> None:
    """Import the modules named in ``DEMOFORGE_TASK_MODULES`` (comma-separated); they register tasks."""
    for module in filter(None, (m.strip() for m in os.environ.get("DEMOFORGE_TASK_MODULES", "").split(","))):
        importlib.import_module(module)


def get_task(name: str) -> TaskEntry:
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _REGISTRY:
        _load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}") from None


def task_names() -> list[str]:
    _load_plugins()
    return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES))
