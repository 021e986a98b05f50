"""platform/rayserve/loopback.py: which hosts are loopback, and the Ray internals it relies on
pinned (a Ray upgrade that moves them fails here, loudly); the switches are exercised for real in
fresh interpreters (the setup hook wraps the replica's own gRPC bind; the node IP turns 127.0.0.1)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from specserve.platform.rayserve import loopback

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def _python(code: str, env: dict[str, str] | None = None) -> str:
    """stdout of `code` in a fresh interpreter (module patches stay out of this process)."""
    child_env = {k: v for k, v in os.environ.items() if k != loopback.ENABLE_CLUSTER_VAR}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_loopback_hosts_get_the_local_only_env_and_the_setup_hook(host):
    assert loopback.is_loopback(host)
    assert loopback.env_for(host) == {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    assert loopback.runtime_env_for(host) == {
        "worker_process_setup_hook": "specserve.platform.rayserve.loopback."
        "bind_replica_grpc_to_loopback"
    }


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "10.1.2.3", "example.com"])
def test_other_hosts_keep_rays_normal_behaviour(host):
    assert not loopback.is_loopback(host)
    assert loopback.env_for(host) == {} and loopback.runtime_env_for(host) == {}
    assert loopback.confine_to(host) == {}
    assert loopback.ENABLE_CLUSTER_VAR not in os.environ


@pytest.mark.parametrize(
    ("address", "bound"),
    [
        ("[::]:0", "127.0.0.1:0"),
        ("0.0.0.0:9000", "127.0.0.1:9000"),
        ("127.0.0.1:5", "127.0.0.1:5"),
        ("10.0.0.1:7", "10.0.0.1:7"),
    ],
)
def test_any_interface_addresses_become_loopback(address, bound):
    assert loopback.loopback_address(address) == bound


def test_ray_internals_this_relies_on_are_where_they_were():
    """Pins: the replica binds its gRPC server through its module's `add_port_to_grpc_server` on
    "[::]:0", and the node IP follows ray_constants.ENABLE_RAY_CLUSTER, set from our env var."""
    from ray._common import tls_utils
    from ray._private import ray_constants, services
    from ray.runtime_env import RuntimeEnv
    from ray.serve._private import replica

    assert replica.add_port_to_grpc_server is tls_utils.add_port_to_grpc_server
    assert 'add_port_to_grpc_server(self._server, "[::]:0")' in inspect.getsource(replica)
    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == loopback.ENABLE_CLUSTER_VAR
    assert isinstance(ray_constants.ENABLE_RAY_CLUSTER, bool)
    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)
    assert "worker_process_setup_hook" in inspect.signature(RuntimeEnv).parameters


def test_the_setup_hook_makes_the_replica_grpc_server_listen_on_loopback_only():
    code = """
import concurrent.futures, json, grpc, psutil
from ray.serve._private import replica
from specserve.platform.rayserve import loopback

def bound_by_the_replica_call():
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    port = replica.add_port_to_grpc_server(server, "[::]:0")  # as ServeReplica does
    server.start()
    conns = psutil.Process().net_connections("inet")
    server.stop(0)
    return sorted({c.laddr.ip for c in conns if c.laddr.port == port and c.status == "LISTEN"})

before = bound_by_the_replica_call()
loopback.bind_replica_grpc_to_loopback()
loopback.bind_replica_grpc_to_loopback()  # idempotent: one wrapper
assert replica.add_port_to_grpc_server.__wrapped__.__module__ == "ray._common.tls_utils"
print(json.dumps([before, bound_by_the_replica_call()]))
"""
    before, after = json.loads(_python(code))
    assert before == ["::"]  # Ray's own bind: every interface
    assert after and set(after) <= LOOPBACK, after


def test_the_node_ip_is_loopback_with_the_env_var_or_after_confine_to():
    ask = "from ray._private import services; print(services.get_node_ip_address())"
    assert _python(ask, loopback.env_for("127.0.0.1")) == "127.0.0.1"
    late = (  # ray imported first, as a caller of up() may have done: the switch still takes
        "import ray\nfrom specserve.platform.rayserve import loopback\n"
        "import os\nassert loopback.confine_to('localhost')\n"
        "assert os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] == '0'\n" + ask
    )
    assert _python(late) == "127.0.0.1"
