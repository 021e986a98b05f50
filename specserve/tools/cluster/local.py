"""A multi-node Ray cluster on this machine (`LocalCluster`): a head started with Ray's fake
multi-node provider, so the autoscaler adds and removes worker nodes (raylets) itself; every
process it starts carries a marker in its environment, so `stop` ends those and nothing else."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import ray
from pydantic import BaseModel

from specserve.platform.state.redis_server import free_port
from specserve.tools.cluster.shape import ClusterShape

MARKER = "SPECSERVE_DEMO_CLUSTER"  # env var every process of one LocalCluster carries
NODE_ID_VAR = "RAY_OVERRIDE_NODE_ID_FOR_TESTING"  # the fake provider names each worker's node id


class NodeView(BaseModel):
    """A live Ray node: its id, whether it is the head, its logical CPUs."""

    node_id: str
    head: bool
    cpus: float


class LocalCluster:
    """`start()` brings up the head (GCS, raylet, autoscaler with the fake provider) on loopback;
    the autoscaler then starts `min_workers` of each node type. `env` goes to every process.
    `gcs_redis` (host:port, password): GCS keeps its tables there, so it can restart. Make it
    before this process imports ray: it puts the cluster's auth token in this environment."""

    def __init__(
        self,
        shape: ClusterShape,
        work_dir: Path,
        env: dict[str, str],
        gcs_redis: tuple[str, str] | None = None,
        object_store_bytes: int = 256 * 2**20,
    ) -> None:
        self.shape, self.work_dir, self.gcs_redis = shape, Path(work_dir), gcs_redis
        self.object_store_bytes = object_store_bytes
        self.marker = uuid.uuid4().hex[:12]
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Ray's token authentication, with a token of this cluster's own (not ~/.ray's)
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env = dict(env) | self.auth | {MARKER: self.marker}
        os.environ.update(self.auth)  # Ray reads them when imported: before `import ray`
        # under /tmp: Ray's unix socket paths must stay short
        self.temp_dir = Path("/tmp") / f"ssd-{self.marker}"
        self._gcs_command: tuple[list[str], dict] | None = None

    def start(self, timeout_s: float = 120.0) -> LocalCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "autoscaling-config.json"
        config.write_text(
            json.dumps(self.shape.autoscaling_config(self.address, self.object_store_bytes))
        )
        env = os.environ | self.env | {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        command = [str(Path(sys.executable).parent / "ray"), "start", "--head"]
        command += [f"--port={self.port}", "--node-ip-address=127.0.0.1"]
        command += [f"--num-cpus={self.shape.head_cpus:g}", "--include-dashboard=false"]
        command += [f"--autoscaling-config={config}", f"--temp-dir={self.temp_dir}"]
        command += ["--disable-usage-stats", f"--object-store-memory={self.object_store_bytes}"]
        if self.gcs_redis is not None:
            address, password = self.gcs_redis
            env["RAY_REDIS_ADDRESS"] = address
            command.append(f"--redis-password={password}")  # Ray passes it on in argv anyway
            env["RAY_external_storage_namespace"] = f"specserve-demo-{self.marker}"
        log = (self.work_dir / "ray-start.log").open("w")
        subprocess.run(command, env=env, stdout=log, stderr=log, check=True, timeout=timeout_s)
        return self

    # ------------------------------------------------------------------------- what runs
    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster (found by the marker in its environment)."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(MARKER) == self.marker:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def nodes(self) -> list[NodeView]:
        """The live nodes, as the GCS lists them (needs `ray.init` to this cluster)."""
        return [
            NodeView(
                node_id=n["NodeID"],
                head=n["Resources"].get("node:__internal_head__", 0) > 0,
                cpus=n["Resources"].get("CPU", 0.0),
            )
            for n in ray.nodes()
            if n["Alive"]
        ]

    def node_processes(self, node_id: str) -> list[psutil.Process]:
        """A worker node's processes: those that carry its node id (its raylet, which the fake
        provider starts with it) and everything under them (workers, replicas, agents)."""
        found: dict[int, psutil.Process] = {}
        for proc in self.processes():
            try:
                if proc.environ().get(NODE_ID_VAR) == node_id:
                    found[proc.pid] = proc
                    found |= {child.pid: child for child in proc.children(recursive=True)}
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return list(found.values())

    # ------------------------------------------------------------------------- faults
    def kill_node(self, node_id: str) -> int:
        """SIGKILL every process of worker node `node_id` at once (a machine lost); how many."""
        procs = self.node_processes(node_id)
        if not procs:
            raise ValueError(f"no processes of node {node_id} in this cluster")
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(procs, timeout=10)
        return len(procs)

    def gcs_process(self) -> psutil.Process | None:
        for proc in self.processes():
            try:
                if Path(proc.exe()).name == "gcs_server":
                    return proc
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return None

    def kill_gcs(self) -> None:
        """SIGKILL the head's GCS server, remembering how it was started (for `restart_gcs`)."""
        proc = self.gcs_process()
        if proc is None:
            raise RuntimeError("no gcs_server in this cluster")
        self._gcs_command = (proc.cmdline(), proc.environ())
        proc.kill()
        proc.wait(10)

    def restart_gcs(self) -> int:
        """Start the GCS server again, same command and environment (as a supervisor, or
        KubeRay restarting the head container, would); its pid."""
        if self._gcs_command is None:
            raise RuntimeError("kill_gcs first")
        command, env = self._gcs_command
        log = (self.work_dir / "gcs-restart.log").open("a")
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
        return proc.pid

    # ------------------------------------------------------------------------- teardown
    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM this cluster's processes, SIGKILL those left after `grace_s`, again until none
        is left (a process may start while others stop); how many were stopped."""
        stopped = 0
        for _ in range(5):
            procs = self.processes()
            if not procs:
                break
            stopped += len(procs)
            _terminate(procs, grace_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return stopped


def _terminate(procs: list[psutil.Process], grace_s: float) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=grace_s)


def wait_for(check, timeout_s: float, poll_s: float = 0.5):
    """Poll `check()` until it returns something truthy (returned) or `timeout_s` passes (None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    return None
