"""Built-in tasks under stable names, with the static facts a job and an export need about them.

A task entry builds its env from options (validated here: unknown keys and wrong types are refused with
the key named) and describes the frames it records, so ``demoforge tasks`` and a job's fingerprint do not
need to start a simulator.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym


class UnknownTaskError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class TaskOptionError(ValueError):
    """A task option is unknown or has the wrong type or range."""


@dataclass(frozen=True)
class CameraSpec:
    name: str
    height: int
    width: int


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
        return self.describe(self.resolve_options(options))

    def build(self, options: Mapping[str, Any] | None = None) -> gym.Env:
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
