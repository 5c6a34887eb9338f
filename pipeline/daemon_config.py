"""The daemon's job file (TOML): parsed strictly, every unknown key or bad value refused by name.

A ``[multiply]`` section makes the job a ``demoforge multiply`` job (docs/multiply.md): its source is checked and
extracted here, before the daemon starts anything, and its file is written into the store when the daemon
starts (:meth:`MultiplyJob.save`)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demoforge.pipeline.flags import control_message
from demoforge.pipeline.job import (DEFAULT_MAX_CONSECUTIVE_ABANDONED, ENCODER_PRIORITY_CHOICES, JobConfigError, JobSpec,
                                    VideoSettings)
from demoforge.pipeline.workers.config import ExecutorConfig, ExecutorError
from demoforge.stages.control import ControlError, ControlSpec, parse_noise, parse_takeover

UNBOUNDED_EPISODES = 10_000_000


class DaemonConfigError(ValueError):
    """The job file is invalid; the message names the key and the reason."""


@dataclass(frozen=True)
class MultiplyJob:
    """A ``[multiply]`` job's source: the store or dataset read, what was extracted from it (a
    ``pipeline.multiply.MultiplySource``) and the file in the job's store it is written to at start."""

    source: Path
    prepared: Any
    file: Path

    def save(self) -> Path:
        return Path(self.prepared.source.save(self.file.parent))


@dataclass(frozen=True)
class DaemonConfig:
    spec: JobSpec
    store: Path
    export_dir: Path | None = None
    export_every_episodes: int = 50
    export_every_seconds: float = 600.0
    export_progress_timeout_seconds: float = 600.0
    repo_id: str | None = None
    prune_after_export: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 9464
    min_free_mb: int = 1024
    disk_check_seconds: float = 5.0
    shutdown_deadline_seconds: float = 60.0
    json_logs: bool = False
    unbounded: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    multiply: MultiplyJob | None = None


# section -> key -> (type(s), description)
_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "job": {"task": ((str,), "task name (with [multiply]: the source's task, the default)"),
            "episodes": ((int, str), "target count or \"unbounded\""),
            "seed": ((int,), "job seed"), "max_attempts": ((int,), "attempts per episode"),
            "workers": ((int,), "env worker threads"), "num_envs": ((int,), "vector rows per worker"),
            "queue_frames": ((int,), "queue capacity"), "options": ((dict,), "task options table"),
            "step_timeout_seconds": ((int, float), "seconds an env call may take before its attempt is aborted"),
            "max_consecutive_abandoned": ((int,), "stop when this many episodes in a row were abandoned (0: never)"),
            "executor": ((str,), "where env workers run: thread, process or ray"),
            "keep_failures": ((bool,), "also commit failed attempts as episodes of their own (generate "
                                       "--keep-failures); periodic exports take the job's episodes only"),
            "encoder_process": ((bool, str), "each worker's encoders run in a process of their own: true, false "
                                              "or \"auto\" (generate --encoder-process)"),
            "encoder_priority": ((str,), "\"auto\", \"normal\" or \"idle\": the encoder process's encoders at "
                                         "idle priority (generate --encoder-priority)")},
    "ray": {"address": ((str,), "HOST:PORT or \"auto\" of a running Ray cluster (default: start a local Ray)"),
            "num_workers": ((int,), "Ray actors (default: job.workers)"),
            "cpus_per_worker": ((int, float), "CPUs each actor reserves"),
            "start_timeout_seconds": ((int, float), "stop (exit 1) when no actor has been running for this long")},
    "video": {"codec": ((str,), "codec"), "crf": ((int,), "quality"), "g": ((int,), "keyframe interval"),
              "preset": ((int, str), "encoder preset"), "encoder_threads": ((int,), "threads per encoder")},
    "store": {"dir": ((str,), "staging store directory")},
    "control": {"noise": ((str,), "gaussian:SCALE[,...][@SEGMENT+...]: noise on the expert's actions"),
                "driver": ((str,), "a LeRobot checkpoint folder or module:factory that drives; the expert labels"),
                "beta": ((int, float), "with driver: the expert's action with this probability each step"),
                "takeover": ((str,), "with driver: gap:BOUND:STEPS, the expert takes over (docs/policy-loop.md)")},
    "export": {"dir": ((str,), "LeRobot dataset directory"), "every_episodes": ((int,), "episodes between exports"),
               "every_seconds": ((int, float), "seconds between exports"), "repo_id": ((str,), "dataset repo id"),
               "prune": ((bool,), "delete the staged data of exported episodes after each export"),
               "progress_timeout_seconds": ((int, float), "end an export that reports no progress for this long "
                                                          "(default 600); it is retried at the next export")},
    "metrics": {"address": ((str,), "HOST:PORT for Prometheus metrics, or \"off\"")},
    "disk": {"min_free_mb": ((int,), "pause generation below this free space"),
             "check_seconds": ((int, float), "how often free space is checked")},
    "shutdown": {"deadline_seconds": ((int, float), "graceful stop deadline")},
    "log": {"json": ((bool,), "structured JSON log lines")},
    "multiply": {"source": ((str,), "the store or dataset whose demonstrations are multiplied (docs/multiply.md)"),
                 "strategy": ((str,), "which source episode gives each segment: \"random\" or \"nearest\""),
                 "interpolation": ((int,), "steps to the start of each moved segment (multiply --interpolation)")},
}


def _check_types(raw: Mapping[str, Any]) -> None:
    for section, table in raw.items():
        if section not in _SCHEMA:
            raise DaemonConfigError(f"unknown section [{section}]; known: {', '.join(_SCHEMA)}")
        if not isinstance(table, Mapping):
            raise DaemonConfigError(f"[{section}] must be a table")
        for key, value in table.items():
            spec = _SCHEMA[section].get(key)
            if spec is None:
                raise DaemonConfigError(f"unknown key {section}.{key}; known keys of [{section}]: "
                                        f"{', '.join(_SCHEMA[section])}")
            types, what = spec
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                raise DaemonConfigError(f"{section}.{key} ({what}) must be "
                                        f"{' or '.join(t.__name__ for t in types)}, got {value!r}")


def load_config(path: Path | str, overrides: Mapping[str, Any] | None = None) -> DaemonConfig:
    """Read a job file; ``overrides`` maps dotted keys (``"job.episodes"``) to values from the CLI."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise DaemonConfigError(f"job file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise DaemonConfigError(f"job file {path} is not valid TOML: {exc}") from None
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        raw.setdefault(section, {})[key] = value
    _check_types(raw)
    return _build(raw, path.resolve().parent)


def _require(raw: Mapping[str, Any], section: str, key: str) -> Any:
    try:
        return raw[section][key]
    except KeyError:
        raise DaemonConfigError(f"missing required key {section}.{key} ({_SCHEMA[section][key][1]})") from None


def _encoder_process(value: bool | str) -> bool | None:
    if isinstance(value, bool):
        return value
    if value != "auto":
        raise DaemonConfigError(f"job.encoder_process must be true, false or \"auto\", got {value!r}")
    return None


def _encoder_idle(value: str) -> bool | None:
    if value not in ENCODER_PRIORITY_CHOICES:
        raise DaemonConfigError(f"job.encoder_priority must be \"auto\", \"normal\" or \"idle\", got {value!r}")
    return ENCODER_PRIORITY_CHOICES[value]


def _build(raw: Mapping[str, Any], base: Path) -> DaemonConfig:
    def resolve(p: str) -> Path:
        if "\x00" in p:
            raise DaemonConfigError(f"path {p!r} contains a NUL byte")
        path = Path(p).expanduser()
        return path if path.is_absolute() else base / path

    job = raw.get("job", {})
    multiply = _multiply(raw["multiply"], job, resolve(_require(raw, "store", "dir")), resolve) \
        if "multiply" in raw else None
    spec, unbounded = _job_spec(raw, multiply)
    executor = _executor(job, raw.get("ray"))
    export = raw.get("export", {})
    host, port = _metrics_address(raw.get("metrics", {}).get("address", "127.0.0.1:9464"))
    numbers = _numbers(raw)
    return DaemonConfig(
        spec=spec, store=resolve(_require(raw, "store", "dir")),
        export_dir=resolve(export["dir"]) if "dir" in export else None,
        export_every_episodes=int(numbers["export.every_episodes"]),
        export_every_seconds=float(numbers["export.every_seconds"]), repo_id=export.get("repo_id"),
        export_progress_timeout_seconds=float(numbers["export.progress_timeout_seconds"]),
        prune_after_export=bool(export.get("prune", False)),
        metrics_host=host or "127.0.0.1", metrics_port=port, min_free_mb=int(numbers["disk.min_free_mb"]),
        disk_check_seconds=float(numbers["disk.check_seconds"]),
        shutdown_deadline_seconds=float(numbers["shutdown.deadline_seconds"]),
        json_logs=bool(raw.get("log", {}).get("json", False)), unbounded=unbounded, executor=executor,
        multiply=multiply[0] if multiply else None)


def _job_spec(raw: Mapping[str, Any], multiply: tuple[MultiplyJob, str, dict[str, Any]] | None
              ) -> tuple[JobSpec, bool]:
    """The ``[job]``, ``[video]`` and ``[control]`` tables as the job (a ``[multiply]`` job's task and options are
    its wrapper's), and whether it runs unbounded; its task options and control checked against the task."""
    job, video = raw.get("job", {}), raw.get("video", {})
    episodes = job.get("episodes", "unbounded")
    unbounded = episodes == "unbounded"
    if isinstance(episodes, str) and not unbounded:
        raise DaemonConfigError(f"job.episodes must be a positive integer or \"unbounded\", got {episodes!r}")
    try:
        settings = VideoSettings(**{k: v for k, v in video.items()})
        task, options = (multiply[1], multiply[2]) if multiply else (_require(raw, "job", "task"),
                                                                      dict(job.get("options", {})))
        spec = JobSpec(task=task, episodes=UNBOUNDED_EPISODES if unbounded else int(episodes),
                       task_options=options, seed=job.get("seed", 0),
                       max_attempts=job.get("max_attempts", 3),
                       workers=job.get("workers", 1) if job.get("executor", "thread") == "thread" else 1,
                       num_envs=job.get("num_envs", 1), queue_frames=job.get("queue_frames", 32), video=settings,
                       step_timeout_s=float(job.get("step_timeout_seconds", 60.0)),
                       max_consecutive_abandoned=job.get("max_consecutive_abandoned",
                                                         DEFAULT_MAX_CONSECUTIVE_ABANDONED),
                       control=_control(raw.get("control")), keep_failures=job.get("keep_failures", False),
                       encoder_process=_encoder_process(job.get("encoder_process", "auto")),
                       encoder_idle=_encoder_idle(job.get("encoder_priority", "auto")))
        from demoforge.pipeline.tasks.registry import get_task

        get_task(spec.task).resolve_options(spec.task_options)
    except (JobConfigError, ValueError, KeyError) as exc:
        if isinstance(exc, DaemonConfigError):
            raise
        raise DaemonConfigError(f"[job]/[video]: {exc}") from None
    try:  # a control that cannot apply to the task is refused before the daemon starts anything
        spec.check_control(get_task(spec.task).info(spec.task_options))
    except JobConfigError as exc:
        raise DaemonConfigError(f"[control]: {exc}") from None
    return spec, unbounded


def _metrics_address(metrics: str) -> tuple[str, int | None]:
    """``metrics.address``: (host, port), or no port for ``"off"``."""
    host, port = "127.0.0.1", None
    if metrics != "off":
        host, sep, port_text = metrics.rpartition(":")
        if not sep or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            raise DaemonConfigError(f"metrics.address must be HOST:PORT or \"off\", got {metrics!r}")
        port = int(port_text)
    return host, port


def _numbers(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The export, disk and shutdown numbers, each checked positive (``disk.min_free_mb`` may be 0)."""
    export, disk = raw.get("export", {}), raw.get("disk", {})
    numbers = {"export.every_episodes": export.get("every_episodes", 50),
               "export.every_seconds": export.get("every_seconds", 600.0),
               "export.progress_timeout_seconds": export.get("progress_timeout_seconds", 600.0),
               "disk.min_free_mb": disk.get("min_free_mb", 1024),
               "disk.check_seconds": disk.get("check_seconds", 5.0),
               "shutdown.deadline_seconds": raw.get("shutdown", {}).get("deadline_seconds", 60.0)}
    for key, value in numbers.items():
        if value < 0 or (key != "disk.min_free_mb" and value == 0):
            raise DaemonConfigError(f"{key} must be positive, got {value!r}")
    return numbers


def _multiply(section: Mapping[str, Any], job: Mapping[str, Any], store: Path,
              resolve: Callable[[str], Path]) -> tuple[MultiplyJob, str, dict[str, Any]]:
    """The ``[multiply]`` job: its source checked and extracted (replayed; nothing is written), and the wrapper
    task and options of the job (``[job] task`` must be the source's, ``[job] options`` overlay its options)."""
    from demoforge.pipeline.multiply import DEFAULT_INTERPOLATION, MAX_INTERPOLATION, SOURCE_DIR, TASK, extract_source
    from demoforge.pipeline.multiply_plan import STRATEGIES, source_file_name

    if "source" not in section:
        raise DaemonConfigError(f"missing required key multiply.source ({_SCHEMA['multiply']['source'][1]})")
    strategy = section.get("strategy", "random")
    if strategy not in STRATEGIES:
        raise DaemonConfigError(f"multiply.strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    interpolation = section.get("interpolation", DEFAULT_INTERPOLATION)
    if not 0 <= interpolation <= MAX_INTERPOLATION:
        raise DaemonConfigError(f"multiply.interpolation must be in 0..{MAX_INTERPOLATION} steps, got "
                                f"{interpolation!r}")
    source = resolve(section["source"]).resolve()
    try:
        prepared = extract_source(source, job.get("task"), dict(job.get("options", {})))
    except ValueError as exc:  # MultiplyInputError, a task option of the source's task
        raise DaemonConfigError(f"[multiply]: {exc}") from None
    file = store.resolve() / SOURCE_DIR / source_file_name(prepared.source.content_hash())
    return (MultiplyJob(source, prepared, file), TASK,
            prepared.job_options(file, strategy, interpolation))


def _control(section: Mapping[str, Any] | None) -> ControlSpec | None:
    """The ``[control]`` table as the job's ControlSpec (None: the expert drives alone)."""
    if not section:
        return None
    try:
        return ControlSpec(noise=parse_noise(section["noise"]) if "noise" in section else None,
                           driver=section.get("driver"), beta=float(section.get("beta", 0.0)),
                           takeover=parse_takeover(section["takeover"]) if "takeover" in section else None)
    except ControlError as exc:
        raise DaemonConfigError(f"[control]: {control_message(exc)}") from None


def _executor(job: Mapping[str, Any], ray: Mapping[str, Any] | None) -> ExecutorConfig:
    kind = job.get("executor", "thread")
    if ray is not None and kind != "ray":
        raise DaemonConfigError(f"a [ray] section is set but job.executor is {kind!r}; set job.executor = \"ray\"")
    ray = ray or {}
    try:
        return ExecutorConfig(kind=kind, workers=ray.get("num_workers", job.get("workers", 1)),
                              ray_address=ray.get("address"), cpus_per_worker=ray.get("cpus_per_worker", 1.0),
                              start_timeout_s=ray.get("start_timeout_seconds", ExecutorConfig.start_timeout_s))
    except ExecutorError as exc:
        raise DaemonConfigError(f"[job]/[ray]: {exc}") from None
