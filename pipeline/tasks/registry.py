"""Built-in tasks under stable names, with the static facts a job and an export need about them.

A task entry builds its env from options (validated here: unknown keys and wrong types are refused with
the key named) and describes the frames it records, so ``demoforge tasks`` and a job's fingerprint do not
need to start a simulator.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import math
import numbers
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

from demoforge.pipeline.environment import prepare_process
from demoforge.pipeline.tasks.instructions import (
    INSTRUCTIONS,
    InstructionsError,
    ParaphrasedInstructions,
    parse_table,
)
from demoforge.pipeline.tasks.randomization import (
    RANDOMIZE,
    RANGES,
    RandomizationError,
    RandomizedScene,
    SceneRandomization,
    check_options,
    enabled_axes,
    option_defaults,
)
from demoforge.storage.names import SAFE_NAME, TaskDefinitionError, check_name  # noqa: F401  (the task API's)
from demoforge.storage.schema import (  # the one camera description (tasks, fingerprint, staging, export)
    CAMERA_KINDS,
    DEPTH,
    CameraSpec,
    check_feature_names,
)


class UnknownTaskError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class TaskOptionError(ValueError):
    """A task option is unknown or has the wrong type or range."""


# Job limits on what one frame may hold, whatever a task's own option checks allow.
MAX_CAMERA_SIDE = 4096
MAX_CAMERAS = 16
MAX_FEATURE_VALUES = 1 << 20
MAX_FPS = 1000


def fingerprint_options(options: Mapping[str, Any], added: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without those of ``added`` that are at their default: an option a task gained later (at
    its default) leaves the job fingerprint, and so the stores written before it existed, unchanged."""
    return {k: v for k, v in options.items() if not (k in added and v == added[k] and type(v) is type(added[k]))}


def depth_camera(camera: CameraSpec) -> CameraSpec:
    """The depth camera rendered with ``camera``: same size, named ``<camera>_depth``."""
    return CameraSpec(f"{camera.name}_depth", camera.height, camera.width, DEPTH)


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_installed(package: str, version: str, task: str, *, missing: str, install: str) -> None:
    """``package`` is installed at the one ``version`` ``task`` is written for: a TaskDefinitionError naming both
    and what to run otherwise (``missing``: how it gets installed; ``install``: the command for that version)."""
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise TaskDefinitionError(f"{package} is not installed; {task} needs {package}=={version} ({missing})") \
            from None
    if installed != version:
        raise TaskDefinitionError(f"{package} {installed} is installed; {task} is written for {package}=={version}: "
                                  f"{install}")


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
            if camera.kind not in CAMERA_KINDS:
                raise TaskDefinitionError(f"camera {camera.name!r} has kind {camera.kind!r}; expected one of "
                                          f"{', '.join(CAMERA_KINDS)}")
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
        try:
            check_feature_names(info.feature_names, {**info.state_shapes, "action": tuple(info.action_shape)})
        except ValueError as exc:
            raise TaskDefinitionError(str(exc)) from None
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
    # A suite's member tasks (registered names, same features): each episode is one member's (pipeline/tasks/suite.py)
    suite: tuple[str, ...] = ()
    # The expert decides from each observation (a reactive expert), so it can label states it did not choose:
    # noise injection and policy drivers (stages/control.py) are allowed only then
    labels_any_state: bool = False
    # Names of the entries of 1-D features ("action", state features), exported as LeRobot features' "names"
    feature_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its defaults, how to describe it and how to build its env for given options."""

    name: str
    defaults: Mapping[str, Any]
    describe: Callable[[Mapping[str, Any]], TaskInfo]
    make_env: Callable[[Mapping[str, Any]], gym.Env]
    check: Callable[[Mapping[str, Any]], None] | None = None
    # What a MuJoCo task lets vary per episode (pipeline/tasks/randomization.py); None: nothing
    randomization: SceneRandomization | None = None
    # Options that change only what is rendered (sizes, cameras, shadows, depth): what rerender may change
    appearance_options: frozenset[str] = frozenset()

    @property
    def generic_defaults(self) -> dict[str, Any]:
        """Options every task has (instruction paraphrases) or a randomizable task has, at their defaults
        (off); left out of fingerprints at those defaults."""
        return {INSTRUCTIONS: "", **(option_defaults(self.randomization) if self.randomization is not None else {})}

    @property
    def all_defaults(self) -> dict[str, Any]:
        """The task's own options and the generic ones."""
        return {**self.defaults, **self.generic_defaults}

    def resolve_options(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overlaid with ``options``; unknown keys or values of the wrong type are refused."""
        defaults = self.all_defaults
        merged = dict(defaults)
        for key, value in (options or {}).items():
            if key not in defaults and key.split(".")[0] == RANDOMIZE:
                raise TaskOptionError(self._unknown_randomization(key))
            if key not in defaults:
                raise TaskOptionError(f"task {self.name!r} has no option {key!r}; known options: "
                                      f"{', '.join(sorted(self.defaults)) or 'none'}")
            default = defaults[key]
            if isinstance(default, bool) != isinstance(value, bool) or (
                    not isinstance(value, type(default)) and not (isinstance(default, float)
                                                                   and isinstance(value, int))):
                raise TaskOptionError(f"task {self.name!r} option {key!r} must be {type(default).__name__}, "
                                      f"got {value!r}")
            merged[key] = float(value) if isinstance(default, float) else value
        if self.check is not None:
            self.check(merged)
        if self.randomization is not None:
            try:
                check_options(merged, self.randomization, self.name)
            except RandomizationError as exc:
                raise TaskOptionError(str(exc)) from None
        if merged[INSTRUCTIONS]:
            try:
                parse_table(str(merged[INSTRUCTIONS]))
            except InstructionsError as exc:
                raise TaskOptionError(f"task {self.name!r} option {INSTRUCTIONS!r}: {exc}") from None
        return merged

    def _unknown_randomization(self, key: str) -> str:
        """Why randomization option ``key`` is refused: the task varies no scene, or it has no such option."""
        if self.randomization is None and (key == RANDOMIZE or key in RANGES):
            return (f"task {self.name!r} cannot be randomized (it declares no scene to vary: docs/diversity.md says "
                    "how a task does)")
        known = [RANDOMIZE, *RANGES] if self.randomization is not None else []
        return (f"task {self.name!r} has no option {key!r}; " + (
            f"its randomization options: {', '.join(known)}" if known
            else "it cannot be randomized either (it declares no scene to vary)"))

    def info(self, options: Mapping[str, Any] | None = None) -> TaskInfo:
        """The task's description for these options, checked: safe names, sizes within the job limits.

        Randomization options at their defaults are left out of ``options`` (and so of job fingerprints):
        stores written before a task could be randomized resume unchanged."""
        resolved = self.resolve_options(options)
        info = self.describe(resolved)
        info = replace(info, options=fingerprint_options(info.options, self.generic_defaults))
        if resolved[INSTRUCTIONS]:
            try:
                parse_table(str(resolved[INSTRUCTIONS]), info.segment_names)
            except InstructionsError as exc:
                raise TaskOptionError(f"task {self.name!r} option {INSTRUCTIONS!r}: {exc}") from None
        return check_task_info(info)

    def build(self, options: Mapping[str, Any] | None = None) -> gym.Env:
        prepare_process()  # before the task's simulator opens a GL context or an encoder starts
        self.info(options)  # refuse an unsafe or oversized description before the env allocates anything
        resolved = self.resolve_options(options)
        env = self.make_env(resolved)
        if self.randomization is not None and enabled_axes(resolved, self.randomization):
            env = RandomizedScene(env, self.randomization, resolved)
        if resolved[INSTRUCTIONS]:
            env = ParaphrasedInstructions(env, parse_table(str(resolved[INSTRUCTIONS])))
        return env


# Built-in tasks are imported on first use: each pulls in a simulator.
_BUILTIN_MODULES = {
    "fetch-pick-place": "demoforge.pipeline.tasks.fetch_pick_place",
    "aloha-transfer-cube": "demoforge.pipeline.tasks.aloha_transfer_cube",
    "aloha-insertion": "demoforge.pipeline.tasks.aloha_insertion",
    "so101-pick-place": "demoforge.pipeline.tasks.so101_pick_place",
    "robosuite-lift": "demoforge.pipeline.tasks.robosuite_lift",
    "robosuite-can": "demoforge.pipeline.tasks.robosuite_can",
    "robosuite-square": "demoforge.pipeline.tasks.robosuite_square",
    "robosuite-stack": "demoforge.pipeline.tasks.robosuite_stack",
    "so101-plugin-pick-cube": "demoforge.pipeline.tasks.so101_plugin",
}
# Built-in families: every name with the prefix is registered when the module is imported; its ``task_names()``
# lists them without importing a simulator.
_BUILTIN_FAMILIES = {
    "metaworld-": "demoforge.pipeline.tasks.metaworld",
}
_REGISTRY: dict[str, TaskEntry] = {}
DEFAULT_TASK = "fetch-pick-place"
#: Installed packages declare tasks here: ``[project.entry-points."demoforge.tasks"] name = "pkg.mod:factory"``.
ENTRY_POINT_GROUP = "demoforge.tasks"
#: Comma-separated modules imported for their ``register`` calls (the older way; still supported).
TASK_MODULES_ENV = "DEMOFORGE_TASK_MODULES"
_SPEC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class TaskPluginError(UnknownTaskError):
    """A task plugin (entry point, ``module:factory`` spec or task module) failed to load."""


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded: which one, from where, and the error it raised."""

    plugin: str
    source: str
    error: str

    def __str__(self) -> str:
        return f"task plugin {self.plugin!r} ({self.source}) failed to load: {self.error}"


_FAILURES: dict[str, PluginFailure] = {}


def register(entry: TaskEntry) -> TaskEntry:
    """Register a task (built-ins call this at import; tests and users may register their own)."""
    existing = _REGISTRY.get(entry.name)
    if existing is not None and existing is not entry:
        raise ValueError(f"task {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


def unregister(name: str) -> TaskEntry:
    """Remove a registered task (its module stays imported: importing it again does not register it again)."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise UnknownTaskError(f"task {name!r} is not registered") from None


@contextmanager
def registered(*entries: TaskEntry) -> Iterator[tuple[TaskEntry, ...]]:
    """Register ``entries`` for the duration of a block, then remove exactly them.

    For tests and for trying a task in a session: the registry is global, and a task left behind would make
    registering it again (a second run of the same test, a re-run cell) fail as a duplicate.
    """
    added: list[TaskEntry] = []
    try:
        for entry in entries:
            register(entry)
            added.append(entry)
        yield entries
    finally:
        for entry in reversed(added):
            if _REGISTRY.get(entry.name) is entry:
                del _REGISTRY[entry.name]


def is_task_spec(name: str) -> bool:
    """``package.module:factory``: a task loaded from an importable module that is not a registered name."""
    return bool(_SPEC.fullmatch(name))


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _entry_from_factory(target: object, name: str) -> TaskEntry:
    """A factory is a :class:`TaskEntry` or a zero-argument callable returning one; it is registered under
    ``name`` (the entry point's name, or the spec itself), so every process resolves the same string."""
    entry = target() if callable(target) and not isinstance(target, TaskEntry) else target
    if not isinstance(entry, TaskEntry):
        raise TypeError(f"expected a TaskEntry or a function returning one, got {type(entry).__name__}")
    if entry.name != name:
        entry = replace(entry, name=name)
    return entry


def _load_spec(spec: str) -> TaskEntry:
    module_name, _, attr = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        entry = _entry_from_factory(target, spec)
    except Exception as exc:
        raise TaskPluginError(str(PluginFailure(spec, "--task spec", _describe_error(exc)))) from exc
    _REGISTRY[spec] = entry
    return entry


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> TaskEntry | None:
    if ep.name in _REGISTRY:
        return _REGISTRY[ep.name]
    if ep.name in _FAILURES:
        return None
    try:
        entry = _entry_from_factory(ep.load(), ep.name)
    except Exception as exc:
        _FAILURES[ep.name] = PluginFailure(ep.name, f"entry point {ep.value}", _describe_error(exc))
        return None
    _REGISTRY[ep.name] = entry
    return entry


def _load_task_modules() -> None:
    """Import the modules named in ``DEMOFORGE_TASK_MODULES``; a module that fails is recorded, not raised,
    so one broken plugin does not hide the other tasks."""
    for module in filter(None, (m.strip() for m in os.environ.get(TASK_MODULES_ENV, "").split(","))):
        if module in _FAILURES:
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:
            _FAILURES[module] = PluginFailure(module, TASK_MODULES_ENV, _describe_error(exc))


def plugin_failures() -> list[PluginFailure]:
    """Plugins that failed to load so far (after :func:`task_names` every declared plugin was tried)."""
    return sorted(_FAILURES.values(), key=lambda f: f.plugin)


def get_task(name: str) -> TaskEntry:
    """The task called ``name``: built-in, registered, an installed entry point, or a ``module:factory`` spec."""
    prepare_process()  # a task module may import its simulator
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    family = next((module for prefix, module in _BUILTIN_FAMILIES.items() if name.startswith(prefix)), None)
    if name not in _REGISTRY and family is not None:
        importlib.import_module(family)
    if name not in _REGISTRY:
        _load_task_modules()
    if name not in _REGISTRY:
        ep = _entry_points().get(name)
        if ep is not None:
            _load_entry_point(ep)
    if name not in _REGISTRY and is_task_spec(name):
        return _load_spec(name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _FAILURES:
        raise TaskPluginError(str(_FAILURES[name]))
    hint = "; ".join(str(f) for f in plugin_failures())
    known = task_names()
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    listing = (f"did you mean {', '.join(close)}? (demoforge tasks lists all {len(known)})" if close
               else f"known tasks: {', '.join(known)}")
    raise UnknownTaskError(f"unknown task {name!r}; {listing}" + (f" (also: {hint})" if hint else ""))


def _family_names() -> set[str]:
    names: set[str] = set()
    for module in _BUILTIN_FAMILIES.values():
        names.update(importlib.import_module(module).task_names())
    return names


def task_names() -> list[str]:
    """Every task that can be named: built-ins, registered ones and installed plugins that load."""
    prepare_process()  # the modules it imports may import their simulators
    _load_task_modules()
    for ep in _entry_points().values():
        _load_entry_point(ep)
    return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES) | _family_names())
