"""Ray actors as workers: one actor per worker, one streaming-generator call per leased episode.

Ray is optional (``pip install 'demoforge[ray]'``) and imported only here, lazily. With no address the driver
starts a local Ray (and shuts it down at the end); with ``auto`` or ``HOST:PORT`` it joins a running cluster
(``ray start --head`` / ``ray start --address HEAD:6379``). Actors are owned by the driver: a driver that dies
takes them with it. Each call's ``_generator_backpressure_num_objects`` bounds how many pieces an actor may
produce ahead of the driver, so a slow writer slows the actors' envs.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio

from demoforge.pipeline.workers.config import EpisodeAssignment, ExecutorConfig, ExecutorUnavailableError, \
    RayUnreachableError, WorkerStartError
from demoforge.pipeline.workers.episode_worker import EpisodeWorker, Piece, WorkerSpec, format_exception
from demoforge.pipeline.workers.process_backend import WorkerLost

AUTH_HINT = ("if the cluster uses token authentication (`ray start --head` turns it on since Ray 2.59), this "
             "machine needs its token: run `ray get-auth-token` on the head and put the token in ~/.ray/auth_token "
             "or RAY_AUTH_TOKEN here")
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

    def __init__(self, ray: Any, actor: Any, slot: int, max_in_flight: int) -> None:
        self._ray, self.actor, self.slot = ray, actor, slot
        self._max_in_flight = max_in_flight
        self.pid: int | None = None
        self.host = "?"

    @property
    def name(self) -> str:
        return f"worker {self.slot} (Ray actor, pid {self.pid})"

    async def handshake(self, timeout_s: float) -> None:
        ray = self._ray
        with anyio.move_on_after(timeout_s) as scope:
            try:
                message = await self.actor.ready.remote()
            except ray.exceptions.RayError as exc:
                raise WorkerStartError(f"worker {self.slot} (Ray actor) died while starting: "
                                       f"{_first_line(exc)}") from None
        if scope.cancelled_caught:
            self.kill()
            raise WorkerStartError(
                f"worker {self.slot} (Ray actor) was not ready within {timeout_s:g} s: the cluster may lack the CPUs "
                "asked for (--cpus-per-worker x --workers), or the worker is stuck importing the task")
        if message[0] == "error":
            self.kill()
            raise WorkerStartError(message[1])
        _, self.pid, self.host = message

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
            raise WorkerLost(f"{self.name} on {self.host} is gone: {_first_line(exc)}") from None
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
        if self.config.ray_address is not None and "ray" not in sys.modules:
            use_cluster_token()  # before Ray reads its configuration from the environment
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
            if address != "auto":
                await self._check_reachable(address)
            try:
                with anyio.fail_after(self.config.connect_timeout_s * 4):
                    await anyio.to_thread.run_sync(lambda: ray.init(address=address, **options),
                                                   abandon_on_cancel=True)
            except TimeoutError:
                raise RayUnreachableError(f"joining the Ray cluster at {address} did not finish within "
                                          f"{self.config.connect_timeout_s * 4:g} s") from None
            except Exception as exc:
                raise RayUnreachableError(f"cannot join a Ray cluster at {address}: {_first_line(exc)}. Start one "
                                          "with `ray start --head`, or leave --ray-address out to start a local "
                                          f"Ray; {AUTH_HINT}") from None
            where = f"the Ray cluster at {address}"
        resources = ray.cluster_resources()
        self._actor_class = ray.remote(num_cpus=self.config.cpus_per_worker, max_restarts=0,
                                       max_task_retries=0)(RayEpisodeWorker)
        return (f"{self.config.workers} actor(s) of {self.config.cpus_per_worker:g} CPU on {where}; the cluster has "
                f"{resources.get('CPU', 0):g} CPUs on {len(ray.nodes())} node(s)")

    async def _check_reachable(self, address: str) -> None:
        """A TCP connect to the head's GCS port first: an unreachable address fails in seconds, clearly."""
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

    async def start_worker(self, slot: int, spec: WorkerSpec) -> RayWorker:
        actor = self._actor_class.options(name=None).remote(spec)
        worker = RayWorker(self._ray, actor, slot, self.config.max_in_flight)
        await worker.handshake(self.config.start_timeout_s)
        return worker

    async def aclose(self) -> None:
        if self._started_local and self._ray is not None:
            await anyio.to_thread.run_sync(self._ray.shutdown)
            self._started_local = False


def use_cluster_token() -> None:
    """Join a token-authenticated cluster with the token this machine has.

    ``ray start --head`` turns token authentication on by default (Ray 2.59+) and saves the token in
    ~/.ray/auth_token, but ``ray.init(address=...)`` sends it only when ``RAY_AUTH_MODE=token`` is set: without
    it the driver retries for 20 s and fails with a bare ConnectionError. A cluster without authentication
    accepts a driver that sends a token, so sending one whenever this machine has one is safe. An explicit
    ``RAY_AUTH_MODE`` is left alone."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(token_file):
        os.environ["RAY_AUTH_MODE"] = "token"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
