"""resolve_store: REDIS_URL -> that Redis; else a private, supervised redis-server (gone after
close); no binary: refused, naming the remedies; the memory store only when asked for. Each says
whether it is durable. EmbeddedRedis itself: loopback, password required, restartable, cleaned up
(durability and supervision: test_embedded_durable.py; finding the binary: test_redis_server.py)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from specserve.platform.state.embedded import NoRedisServer, StoreSettings, resolve_store
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_server import EmbeddedRedis
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.registry import Registry, VariantSpec


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_settings_from_env():
    s = StoreSettings.from_env({"REDIS_URL": "redis://:pw@h:1/1", "SPECSERVE_POOL_REDIS_URL": ""})
    assert s.redis_url.get_secret_value() == "redis://:pw@h:1/1" and s.pool_redis_url is None
    assert "pw" not in repr(s)
    assert StoreSettings.from_env({}).redis_url is None
    assert StoreSettings.from_env({}, redis_server_binary="/x").redis_server_binary == "/x"
    assert StoreSettings().store == "redis"  # the memory store is never the default


def test_without_redis_url_an_embedded_server_is_started_and_stopped():
    stores = resolve_store(StoreSettings())
    try:
        assert stores.kind == "redis-embedded" and isinstance(stores.registry, RedisStore)
        assert stores.durable() is False and stores.registry.durable() is False  # no data dir
        assert stores.pools is stores.registry
        server = stores.embedded
        assert server.running and stores.redis_url == server.url
        assert server.supervise and server.data_dir is None  # nothing kept without a data dir
        assert server.password not in stores.describe() and server.password not in repr(stores)
        stores.registry.ping()
        Registry(stores.registry).register(
            VariantSpec(name="v", base_model="m", adapter_path="/a", adapter_sha256="0" * 64)
        )
        anonymous = redis.Redis(
            host="127.0.0.1", port=server.port, socket_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.AuthenticationError):
            anonymous.get("x")
        anonymous.close()
        port, pid, workdir = server.port, server.pid, server._dir
        assert workdir.is_dir()
    finally:
        stores.close()
    assert not server.running and _refused(port)
    assert not os.path.exists(f"/proc/{pid}") and not workdir.exists()
    stores.close()  # idempotent


def test_without_the_binary_redis_is_refused_naming_the_remedies():
    settings = StoreSettings(redis_server_binary="/nonexistent/redis-server")
    with pytest.raises(NoRedisServer) as refused:
        resolve_store(settings)
    message = str(refused.value)
    assert "/nonexistent/redis-server" in message
    for remedy in (
        "scripts/setup.sh",
        "apt-get install redis-server",
        "REDIS_URL",
        "--store memory",
    ):
        assert remedy in message


def test_a_missing_name_is_refused_saying_where_it_was_looked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    with pytest.raises(NoRedisServer, match=r"'redis-server' on PATH or in .*venv/bin"):
        resolve_store(StoreSettings())


def test_the_memory_store_only_when_asked_for(caplog):
    settings = StoreSettings(store="memory", redis_server_binary="/nonexistent/redis-server")
    with caplog.at_level(logging.INFO, logger="specserve.platform.state.embedded"):
        stores = resolve_store(settings)
    assert stores.kind == "memory" and isinstance(stores.registry, MemoryStore)
    assert stores.pools is stores.registry and stores.embedded is None and stores.redis_url is None
    assert stores.durable() is False and "memory" in caplog.text
    stores.close()


def test_the_memory_store_and_a_redis_url_are_not_both_taken(redis_server):
    with pytest.raises(ValueError, match="unset one"):
        resolve_store(StoreSettings(store="memory", redis_url=redis_server.url))


def test_redis_url_is_used_as_given_and_pools_may_live_elsewhere(redis_server):
    with EmbeddedRedis() as pool_server:
        settings = StoreSettings(redis_url=redis_server.url, pool_redis_url=pool_server.url)
        with resolve_store(settings) as stores:
            assert stores.kind == "redis-external" and stores.embedded is None
            assert stores.durable() is False  # the fixture's server: no AOF, no snapshots
            stores.registry.set("k", "registry")
            stores.pools.set("k", "pools")
            assert stores.registry.get("k") == "registry" and stores.pools.get("k") == "pools"
            assert RedisStore(redis_server.url).get("k") == "registry"
        with resolve_store(StoreSettings(redis_url=redis_server.url)) as stores:
            assert stores.pools is stores.registry and stores.pool_redis_url == redis_server.url
        assert redis_server.running  # a given Redis is never stopped by close


def test_embedded_restarts_on_the_same_address():
    server = EmbeddedRedis().start()
    try:
        port, url = server.port, server.url
        server.stop()
        assert _refused(port)
        server.start()
        assert server.port == port and server.url == url
        assert RedisStore(url).get("missing") is None
    finally:
        server.stop()


def test_missing_binary_is_refused():
    with pytest.raises(FileNotFoundError):
        EmbeddedRedis("/nonexistent/redis-server").start()
    assert EmbeddedRedis.find("/nonexistent/redis-server") is None


_ORPHAN = """
from specserve.platform.state.redis_server import EmbeddedRedis
server = EmbeddedRedis().start()
print(server.pid, server.port, flush=True)
import time; time.sleep(60)
"""


def test_the_server_dies_with_a_killed_parent():
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        pid, port = map(int, parent.stdout.readline().split())
        assert os.path.exists(f"/proc/{pid}")
    finally:
        parent.kill()  # SIGKILL: no atexit
        parent.wait(10)
    deadline = time.monotonic() + 10
    while not _refused(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _refused(port)
