"""Loopback by default for `specserve up`: on a loopback --host, Ray's node IP becomes 127.0.0.1
(so GCS, raylet, workers and agents listen there) and each Serve replica's inter-deployment gRPC
server binds 127.0.0.1 instead of [::]. The only module that touches Ray internals for this."""

from __future__ import annotations

import functools
import ipaddress
import os

# Ray's own switch (ray_constants.ENABLE_RAY_CLUSTER, read when ray is imported): off, a node
# takes the loopback IP as its address, as Ray does by default on macOS and Windows
ENABLE_CLUSTER_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOCAL_ONLY_ENV = {ENABLE_CLUSTER_VAR: "0"}
SETUP_HOOK = f"{__name__}.bind_replica_grpc_to_loopback"
ANY_INTERFACE_PREFIXES = ("[::]:", "0.0.0.0:")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def env_for(host: str) -> dict[str, str]:
    """Environment of `up` and of every Ray process it starts; empty for a non-loopback host."""
    return dict(LOCAL_ONLY_ENV) if is_loopback(host) else {}


def runtime_env_for(host: str) -> dict:
    """What `ray.init(runtime_env=...)` adds to the job's runtime env: the setup hook each worker
    runs before its first task (replicas inherit it); empty for a non-loopback host."""
    return {"worker_process_setup_hook": SETUP_HOOK} if is_loopback(host) else {}


def confine_to(host: str) -> dict[str, str]:
    """Make this process's coming `ray.init` start a loopback-only node when `host` is loopback;
    returns env_for(host) for the child processes. Works whether ray is imported yet or not."""
    env = env_for(host)
    if not env:
        return env
    os.environ.update(env)
    # ray_constants reads the env var at import, which must come after the update above
    from ray._private import ray_constants  # lazy: imported after os.environ.update

    ray_constants.ENABLE_RAY_CLUSTER = False
    return env


def loopback_address(address: str) -> str:
    """ "[::]:PORT" or "0.0.0.0:PORT" -> "127.0.0.1:PORT"; any other address unchanged."""
    for prefix in ANY_INTERFACE_PREFIXES:
        if address.startswith(prefix):
            return "127.0.0.1:" + address.removeprefix(prefix)
    return address


def bind_replica_grpc_to_loopback() -> None:
    """worker_process_setup_hook: the Serve replica's gRPC server (bound on "[::]:0" by
    ray.serve._private.replica) binds on 127.0.0.1; idempotent."""
    from ray.serve._private import replica  # lazy: Ray Serve (~3 s); `up`'s tools import this

    bind = replica.add_port_to_grpc_server
    if getattr(bind, "specserve_loopback", False):
        return

    @functools.wraps(bind)
    def bind_on_loopback(server, address):
        return bind(server, loopback_address(address))

    bind_on_loopback.specserve_loopback = True
    replica.add_port_to_grpc_server = bind_on_loopback
