"""Ray actors as workers: one actor per worker, one streaming-generator call per leased episode.

Ray is optional (``pip install 'demoforge[ray]'``) and imported only here, lazily. With no address the driver
starts a local Ray (and shuts it down at the end); with ``auto`` or ``HOST:PORT`` it joins a running cluster
(``ray start --head`` / ``ray start --address HEAD:6379``), with a token only if the cluster asks for one
(:mod:`.ray_auth`). Actors are owned by the driver: a driver that dies takes them with it. An actor waits
for room in the cluster as long as the executor lets it (it is created at once and placed by Ray). Each call's ``_generator_backpressure_num_objects`` bounds how many pieces an actor may
produce ahead of the driver, so a slow writer slows the actors' envs.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from demoforge.pipeline.workers.config import (
    ExecutorConfig,
    ExecutorUnavailableError,
    RayUnreachableError,
    WorkerStartError,
)
from demoforge.pipeline.workers.episode_worker import EpisodeWorker, Piece, WorkerSpec, format_exception
from demoforge.pipeline.workers.process_backend import WorkerLost
from demoforge.pipeline.workers.ray_auth import settle_auth
from demoforge.stages.records import EpisodeAssignment

INSTALL_HINT = "install it with: pip install 'demoforge[ray]' (on the driver and on every worker machine)"
LOCAL_OBJECT_STORE_BYTES = 256 << 20  # pieces are small and bounded in number; Ray's default takes 30% of RAM


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorUnavailableError(f"--executor ray needs Ray, which is not installed; {INSTALL_HINT}") from None
    return ray


class RayEpisodeWorker:
    """The actor: an :class:`EpisodeWorker` kept between calls. Start-up errors are returned by
    :meth:`ready`, not raised, so the driver can show them in a few lines."""

    def __init__(self, spec: WorkerSpec) -> None:
        from demoforge.storage.scheduling import reset_process_priority

        reset_process_priority()  # an actor runs at normal priority whatever started its process
        self.worker: EpisodeWorker | None = None
        self.error: str | None = None
        try:
            self.worker = EpisodeWorker(spec)
        except WorkerStartError as exc:
            self.error = str(exc)
        except Exception as exc:
            self.error = f"worker {spec.worker} cannot start: {format_exception(exc)}"

    def ready(self) -> tuple:
        if self.error is not None:
            return ("error", self.error)
        return ("ready", os.getpid(), socket.gethostname())

    def run_lease(self, episode: int, first_attempt: int):  # a streaming generator of Pieces
        assert self.worker is not None
        yield from self.worker.run_lease(episode, first_attempt)


class RayWorker:
    """Driver-side handle of one actor."""

    def __init__(self, ray: Any, actor: Any, slot: int, max_in_flight: int, cpus: float) -> None:
        self._ray, self.actor, self.slot = ray, actor, slot
        self._max_in_flight, self._cpus = max_in_flight, cpus
        self.pid: int | None = None
        self.host = "?"

    @property
    def name(self) -> str:
        return f"worker {self.slot} (Ray actor, pid {self.pid})"

    async def ready(self) -> None:
        """Until the actor is placed and has built its env. No time limit: the executor decides how long a
        start may wait for room; a cancelled wait cancels the actor's creation."""
        ray = self._ray
        try:
            message = await self.actor.ready.remote()
        except ray.exceptions.RayError as exc:
            why = await anyio.to_thread.run_sync(self._start_death, exc, abandon_on_cancel=True)
            raise WorkerStartError(f"worker {self.slot} (Ray actor) died while starting: {why}") from None
        except BaseException:
            self.kill()  # cancelled (the job is over, or no worker could be placed): drop the pending actor
            raise
        if message[0] == "error":
            self.kill()
            raise WorkerStartError(message[1])
        _, self.pid, self.host = message

    async def unplaced(self) -> str | None:
        """Why the actor still waits for a node (Ray gives it a process once placed), or None."""
        ray = self._ray
        info = await anyio.to_thread.run_sync(ray._private.state.actors, self.actor._actor_id.hex(),
                                              abandon_on_cancel=True)
        if info.get("Pid") or info.get("State") != "PENDING_CREATION":
            return None
        free, total = await anyio.to_thread.run_sync(_cpus, ray, abandon_on_cancel=True)
        return f"the cluster has {free:g} of {total:g} CPUs free and a worker needs {self._cpus:g} (--cpus-per-worker)"

    def _start_death(self, exc: BaseException) -> str:
        """Ray's cause of death and, where the actor's log is on this machine, the last lines of its stderr."""
        why = death_cause(exc)
        try:
            tail = actor_stderr_tail(self._ray, self.actor)
        except Exception:  # the GCS is gone too, or the log is unreadable: the cause above is what we have
            tail = []
        return why + (f"; its stderr ended with: {' | '.join(tail)}" if tail else "")

    async def pieces(self, lease: EpisodeAssignment) -> AsyncIterator[Piece]:
        ray = self._ray
        try:
            stream = self.actor.run_lease.options(
                num_returns="streaming", _generator_backpressure_num_objects=self._max_in_flight,
            ).remote(lease.episode_index, lease.first_attempt)
            async for ref in stream:
                piece: Piece = await ref
                yield piece
                if piece.lease_done:
                    return
        except ray.exceptions.RayError as exc:
            raise WorkerLost(f"{self.name} on {self.host} is gone: {death_cause(exc)}") from None
        raise WorkerLost(f"{self.name} on {self.host} ended episode {lease.episode_index} early")

    def kill(self) -> None:
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # already dead, or Ray is shutting down
            pass

    async def aclose(self) -> None:
        self.kill()


class RayBackend:
    kind = "ray"

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config
        self._ray: Any = None
        self._actor_class: Any = None
        self._started_local = False

    async def connect(self) -> str:
        ray = self._ray = import_ray()
        address = self.config.ray_address
        options: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
        if ray.is_initialized():
            where = "the Ray this process already joined"
        elif address is None:
            cpus = max(os.cpu_count() or 1, math.ceil(self.config.workers * self.config.cpus_per_worker))
            ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)
            self._started_local = True
            where = f"a local Ray started by this run ({cpus} CPUs)"
        else:
            gcs = await self._resolve(address)
            limit = self.config.connect_timeout_s * 4
            try:
                with anyio.fail_after(limit):
                    auth = await anyio.to_thread.run_sync(settle_auth, ray, gcs, abandon_on_cancel=True)
                    await anyio.to_thread.run_sync(lambda: ray.init(address=gcs, **options), abandon_on_cancel=True)
            except TimeoutError:
                raise RayUnreachableError(f"joining the Ray cluster at {address} did not finish within {limit:g} s") \
                    from None
            except RayUnreachableError:
                raise
            except Exception as exc:
                raise RayUnreachableError(f"cannot join a Ray cluster at {address}: {_first_line(exc)}. Start one "
                                          "with `ray start --head`, or leave --ray-address out to start a local "
                                          "Ray") from None
            where = f"the Ray cluster at {address}, {auth.describe()}"
        resources = ray.cluster_resources()
        self._actor_class = ray.remote(num_cpus=self.config.cpus_per_worker, max_restarts=0,
                                       max_task_retries=0)(RayEpisodeWorker)
        return (f"up to {self.config.workers} actor(s) of {self.config.cpus_per_worker:g} CPU on {where}; the "
                f"cluster has {resources.get('CPU', 0):g} CPUs on {len(ray.nodes())} node(s)")

    async def _resolve(self, address: str) -> str:
        """HOST:PORT of the head's GCS: ``auto`` is looked up as Ray does; a TCP connect comes first, so an
        unreachable address fails in seconds, clearly."""
        if address == "auto":
            from ray._private.services import canonicalize_bootstrap_address_or_die

            try:
                address = canonicalize_bootstrap_address_or_die("auto")
            except Exception as exc:
                raise RayUnreachableError(f"--ray-address auto found no Ray cluster on this machine "
                                          f"({_first_line(exc)}); start one with `ray start --head` or give "
                                          "HOST:PORT") from None
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RayUnreachableError(f"Ray address {address!r} is not HOST:PORT or \"auto\"")
        timeout = self.config.connect_timeout_s

        def probe() -> None:
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass

        try:
            await anyio.to_thread.run_sync(probe, abandon_on_cancel=True)
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
            raise RayUnreachableError(
                f"no Ray cluster is reachable at {address} ({reason} within {timeout:g} s). Start the head with "
                "`ray start --head --port 6379` and give its HOST:PORT, or leave --ray-address out to start a local "
                "Ray") from None
        return address

    async def start_worker(self, slot: int, spec: WorkerSpec) -> RayWorker:
        actor = self._actor_class.options(name=None).remote(spec)
        return RayWorker(self._ray, actor, slot, self.config.max_in_flight, self.config.cpus_per_worker)

    async def lacks_room(self) -> str | None:
        """What the cluster lacks for one more worker, or None when it has the CPUs free."""
        need = self.config.cpus_per_worker
        free, total = await anyio.to_thread.run_sync(_cpus, self._ray, abandon_on_cancel=True)
        if free >= need:
            return None
        return f"the cluster has {free:g} of {total:g} CPUs free and a worker needs {need:g} (--cpus-per-worker)"

    async def aclose(self) -> None:
        if self._started_local and self._ray is not None:
            await anyio.to_thread.run_sync(self._ray.shutdown)
            self._started_local = False


def _cpus(ray: Any) -> tuple[float, float]:
    """Free and total CPUs of the cluster (Ray leaves a resource out when none of it is free)."""
    return ray.available_resources().get("CPU", 0.0), ray.cluster_resources().get("CPU", 0.0)


def death_cause(exc: BaseException) -> str:
    """Ray's error in one line with its cause ("The actor is dead because its node has died"), without the
    id fields and the generic advice Ray appends."""
    lines = str(exc).strip().splitlines()
    causes = " ".join(line.strip() for line in lines[1:] if line.strip() and not line.startswith("\t"))
    causes = causes.split(" Some common causes include")[0].strip()
    return f"{_first_line(exc)}{' ' + causes if causes else ''}"


def actor_stderr_tail(ray: Any, actor: Any, lines: int = 5) -> list[str]:
    """The last lines the actor's process wrote to stderr, when its node's log folder is on this machine
    (a local Ray, or a cluster node on the driver's machine); [] otherwise. Blocking (asks the GCS)."""
    info = ray._private.state.actors(actor._actor_id.hex())
    pid, node_id = info.get("Pid") or 0, (info.get("Address") or {}).get("NodeID")
    if not pid or not node_id:
        return []
    for node in ray.nodes():
        if node.get("NodeID") != node_id:
            continue
        logs = Path(node.get("RayletSocketName", "")).parent.parent / "logs"
        for path in logs.glob(f"worker-*-{pid}.err"):
            text = path.read_text(errors="replace").splitlines()
            return [t.strip() for t in text if t.strip() and not t.startswith(":")][-lines:]
    return []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
