"""Which executor runs the env workers, and its limits; the errors a scale-out run can report."""

from __future__ import annotations

from dataclasses import dataclass

EXECUTORS = ("thread", "process", "ray")
MAX_REMOTE_WORKERS = 1024

__all__ = ["EXECUTORS", "ExecutorConfig", "ExecutorError", "ExecutorUnavailableError",
           "NoWorkersError", "RayAuthenticationError", "RayUnreachableError", "WorkerStartError", "WorkersLostError"]


class ExecutorError(RuntimeError):
    """A scale-out executor cannot run the job (a usage or environment problem, reported in a few lines)."""


class ExecutorUnavailableError(ExecutorError):
    """The executor needs a package that is not installed (``--executor ray`` without Ray)."""


class RayUnreachableError(ExecutorError):
    """``--ray-address`` names no reachable Ray cluster."""


class RayAuthenticationError(RayUnreachableError):
    """The cluster uses token authentication and this machine has no token, or not the cluster's."""


class WorkerStartError(ExecutorError):
    """A worker could not start: its task cannot be imported or built there, or it died while starting."""


class WorkersLostError(RuntimeError):
    """Workers kept dying; the job stops (committed episodes are kept, re-run to resume)."""


class NoWorkersError(WorkersLostError):
    """No worker runs and none could be started (placed) within the start timeout; the job stops."""


@dataclass(frozen=True)
class ExecutorConfig:
    """How env workers run. ``thread`` is the in-process pipeline; ``process`` and ``ray`` run ``workers``
    remote workers, each holding at most ``max_in_flight`` pieces of ``batch_frames`` frames not yet taken
    by the driver's write stage (the per-worker backpressure limit)."""

    kind: str = "thread"
    workers: int = 1
    ray_address: str | None = None  # None: start a local Ray; "auto" or HOST:PORT: join a running cluster
    cpus_per_worker: float = 1.0
    max_in_flight: int = 4
    batch_frames: int = 16
    # With no worker running for this long (none placed, or every worker lost and none replaced) the job stops.
    # While one worker runs, a start that waits for room in the cluster is no error: it joins when placed.
    start_timeout_s: float = 180.0
    connect_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ExecutorError(f"unknown executor {self.kind!r}; choose one of {', '.join(EXECUTORS)}")
        checks = {"the number of workers (--workers)": (self.workers, 1, MAX_REMOTE_WORKERS), "max_in_flight": (self.max_in_flight, 1, 1024),
                  "batch_frames": (self.batch_frames, 1, 10_000)}
        for name, (value, lo, hi) in checks.items():
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ExecutorError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if not isinstance(self.start_timeout_s, (int, float)) or isinstance(self.start_timeout_s, bool) \
                or not 0 < self.start_timeout_s <= 86_400:
            raise ExecutorError(f"the worker start timeout (--start-timeout) must be in (0, 86400] seconds, got "
                                f"{self.start_timeout_s!r}")
        if not isinstance(self.cpus_per_worker, (int, float)) or isinstance(self.cpus_per_worker, bool) \
                or not 0 < self.cpus_per_worker <= 1024:
            raise ExecutorError(f"cpus_per_worker must be in (0, 1024], got {self.cpus_per_worker!r}")
        if self.ray_address is not None and self.kind != "ray":
            raise ExecutorError(f"a Ray address was given but the executor is {self.kind!r}; use --executor ray")
        if self.ray_address is not None and not self.ray_address.strip():
            raise ExecutorError("the Ray address is empty; give HOST:PORT, \"auto\", or leave it out for a local Ray")

    @property
    def remote(self) -> bool:
        return self.kind != "thread"
