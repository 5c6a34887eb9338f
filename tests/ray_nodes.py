"""A real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: one GCS, one raylet per node),
run by a host process of its own so that the cluster's authentication mode and Ray's process-wide state stay
out of the process that uses it (a test session, the crash campaign)::

    cluster = LocalCluster(folder, auth=False, head_cpus=1, nodes=1)
    cluster.address            # what `generate --executor ray --ray-address` joins
    cluster.add_node(cpus=1)   # a node joins
    cluster.remove_node()      # a node is lost: its raylet and its workers are SIGKILLed
    cluster.resize(1)          # exactly this many nodes besides the head
    cluster.close()

``auth=True`` starts the cluster with token authentication (``RAY_AUTH_MODE=token``); its token is in
``cluster.token_file``. The host (``python ray_nodes.py RAY_TMP HEAD_CPUS``) reads one command per line
and answers one JSON line starting with ``@@``; it shuts the cluster down when its input ends, so a cluster
never outlives whoever started it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REPLY = "@@ "


class LocalCluster:
    def __init__(self, folder: Path, *, auth: bool, head_cpus: int = 1, nodes: int = 0,
                 env: dict[str, str] | None = None, timeout: float = 300) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        # Ray's socket paths must stay under 108 bytes: its temp folder is short, not a deep test folder.
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="dfr"))
        self.token_file: Path | None = None
        child = dict(env if env is not None else os.environ)
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
            child.pop(key, None)
        child["RAY_AUTH_MODE"] = "token" if auth else "disabled"
        if auth:
            self.token_file = self.folder / "cluster_token"
            self.token_file.write_text(secrets.token_hex(16))
            child["RAY_AUTH_TOKEN_PATH"] = str(self.token_file)
        child["RAY_TMPDIR"] = str(self.ray_tmp)  # also where Cluster records its address (not /tmp/ray)
        child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(HERE), child.get("PYTHONPATH", "")]))
        child["PYTHONUNBUFFERED"] = "1"
        self._log = open(self.folder / "cluster.log", "wb")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(self.ray_tmp),
                                      str(head_cpus)], env=child, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        self.address: str = self._reply()["address"]
        for _ in range(nodes):
            self.add_node()

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the Ray cluster host exited ({self.proc.poll()}); see {self.folder}/cluster.log")
            if line.startswith(REPLY):
                answer = json.loads(line[len(REPLY):])
                if "error" in answer:
                    raise RuntimeError(f"the Ray cluster host failed: {answer['error']}")
                return answer
        raise TimeoutError("the Ray cluster host did not answer in time")

    def _ask(self, *words: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def add_node(self, cpus: int = 1) -> str:
        """Start one more node and wait until the cluster counts it; returns its node id."""
        return str(self._ask("add", cpus)["node"])

    def remove_node(self, node: str | None = None) -> dict[str, Any]:
        """SIGKILL a node's raylet and processes (the newest worker node unless named); returns its ``node``
        id and ``workers``, the pids of the raylet's child processes (Ray workers and agents) at the kill."""
        return self._ask("remove", node or "newest")

    def pids(self, node: str | None = None) -> list[int]:
        """Pids of a node's raylet's child processes now (the newest worker node unless named): its Ray
        workers, and so the job's actors placed there."""
        return list(self._ask("pids", node or "newest")["pids"])

    def nodes(self) -> list[str]:
        """Node ids besides the head, oldest first."""
        return list(self._ask("nodes")["nodes"])

    def resize(self, nodes: int) -> None:
        current = self.nodes()
        for _ in range(len(current), nodes):
            self.add_node()
        for node in current[nodes:]:
            self.remove_node(node)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._ask("quit")
            except (OSError, RuntimeError, TimeoutError):
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        import shutil

        shutil.rmtree(self.ray_tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the host
def _serve(head_cpus: int) -> None:
    import psutil
    from ray.cluster_utils import Cluster

    def answer(**fields: Any) -> None:
        print(REPLY + json.dumps(fields), flush=True)

    def workers_of(node: Any) -> list[int]:
        raylet = node.all_processes.get("raylet")
        if not raylet:
            return []
        try:
            children = psutil.Process(raylet[0].process.pid).children(recursive=True)
        except psutil.Error:
            return []
        return [p.pid for p in children]

    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "include_dashboard": False})
    answer(address=cluster.address, seconds=round(time.monotonic() - started, 2))
    nodes: list[Any] = []  # worker nodes, oldest first
    try:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                if words[0] == "add":
                    started = time.monotonic()
                    node = cluster.add_node(num_cpus=int(words[1]))
                    cluster.wait_for_nodes()
                    nodes.append(node)
                    answer(node=node.node_id, seconds=round(time.monotonic() - started, 2))
                elif words[0] in ("remove", "pids"):
                    node = nodes[-1] if words[1] == "newest" else next(n for n in nodes if n.node_id == words[1])
                    pids = workers_of(node)
                    if words[0] == "pids":
                        answer(pids=pids)
                        continue
                    started = time.monotonic()
                    # A lost machine loses every process at once. Ray's remove_node kills the raylet only; its
                    # workers notice on their own, which on a loaded machine took longer than a short job.
                    for pid in pids:
                        try:
                            psutil.Process(pid).kill()
                        except psutil.Error:
                            pass
                    cluster.remove_node(node, allow_graceful=False)
                    nodes.remove(node)
                    answer(node=node.node_id, workers=pids, seconds=round(time.monotonic() - started, 2))
                elif words[0] == "nodes":
                    answer(nodes=[n.node_id for n in nodes])
                elif words[0] == "quit":
                    break
                else:
                    answer(error=f"unknown command {words[0]!r}")
            except Exception as exc:  # report it to the caller, keep serving
                answer(error=f"{type(exc).__name__}: {exc}")
    finally:
        cluster.shutdown()
        answer(done=True)


if __name__ == "__main__":
    (Path(sys.argv[1]) / "ray").mkdir(parents=True, exist_ok=True)
    _serve(int(sys.argv[2]))
