"""The rendered Redis containers, run for real: each overlay's command and redis.conf, started with
redis-server on a loopback port, refuses clients without the password and has its role's settings."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from scripts.k8s_validate.render import the

PASSWORD = "0123456789abcdef0123456789abcdef"
ROLES = {  # workload, ConfigMap key, settings redis-server must report
    "registry": (
        ("StatefulSet", "specserve-redis-registry"),
        "registry.conf",
        {"appendonly": "yes", "maxmemory-policy": "noeviction", "maxmemory": str(768 * 2**20)},
    ),
    "pool": (
        ("Deployment", "specserve-redis-pool"),
        "pool.conf",
        {
            "appendonly": "no",
            "maxmemory-policy": "allkeys-lru",
            "maxmemory": str(256 * 2**20),
            "save": "",
        },
    ),
}

needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="redis-server not installed"
)


def _server_dir() -> str:
    return str(Path(shutil.which("redis-server")).parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raw(port: int, command: bytes) -> bytes:
    """One RESP command on a fresh connection (no client library retrying on auth errors)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(command)
        return s.recv(256)


def _start(objs, role, tmp_path):
    (kind, name), key, _ = ROLES[role]
    container = the(objs, kind, name)["spec"]["template"]["spec"]["containers"][0]
    conf = the(objs, "ConfigMap", "specserve-redis-config")["data"][key]
    port = _free_port()
    assert "port 6379\n" in conf
    conf = conf.replace("port 6379\n", f"port {port}\nbind 127.0.0.1\n")
    if "dir /data\n" in conf:
        conf = conf.replace("dir /data\n", f"dir {tmp_path}\n")
    (tmp_path / "redis.conf").write_text(conf)
    argv = container["command"] + container["args"]
    assert argv[:2] == ["sh", "-c"] and "/etc/redis/redis.conf" in argv[2]
    argv[2] = argv[2].replace("/etc/redis/redis.conf", str(tmp_path / "redis.conf"))
    proc = subprocess.Popen(
        argv,
        # the redis-server `needs_redis` found (setup may link one into the venv), then the system's
        env={"PATH": _server_dir() + ":/usr/bin:/bin:/usr/sbin:/sbin", "REDIS_PASSWORD": PASSWORD},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, password=PASSWORD, socket_timeout=5)
    for _ in range(100):
        try:
            client.ping()
            return proc, port, client
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None:
                raise AssertionError(f"redis-server exited with {proc.returncode}")
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("redis-server did not come up")


@needs_redis
@pytest.mark.parametrize("role", sorted(ROLES))
def test_redis_container_requires_password_and_keeps_its_role(rendered, role, tmp_path):
    proc, port, client = _start(rendered["dev"], role, tmp_path)
    try:
        assert _raw(port, b"PING\r\n").startswith(b"-NOAUTH")
        assert _raw(port, b"AUTH wrong\r\n").startswith(b"-WRONGPASS")
        for setting, want in ROLES[role][2].items():
            assert client.config_get(setting)[setting] == want, setting
        client.set("specserve:probe", "1")
        assert client.get("specserve:probe") == b"1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    if role == "registry":  # the AOF went to the data directory (the PVC in the cluster)
        assert (tmp_path / "appendonlydir").is_dir()


def test_overlays_share_the_redis_setup(rendered):
    """What ran above for dev is what every overlay deploys."""
    for name, objs in rendered.items():
        assert (
            the(objs, "ConfigMap", "specserve-redis-config")["data"]
            == the(rendered["dev"], "ConfigMap", "specserve-redis-config")["data"]
        ), name
        for (kind, wname), _, _ in ROLES.values():
            ours = the(objs, kind, wname)["spec"]["template"]["spec"]["containers"][0]
            dev = the(rendered["dev"], kind, wname)["spec"]["template"]["spec"]["containers"][0]
            assert (ours["command"], ours["args"], ours["env"]) == (
                dev["command"],
                dev["args"],
                dev["env"],
            )
