"""The embedded redis-server keeps the registry: its AOF survives a restart of the app (same data
dir), a SIGKILLed server is restarted by the supervisor with its data and clients reconnect, health
returns to ok by itself, stop() is never mistaken for a death, and one data dir has one server."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import sys
import threading
import time

import pytest
from redis.backoff import ExponentialBackoff

from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.backend import LocalBackend
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.embedded import SERVER_FILE, StoreSettings, resolve_store
from specserve.platform.state.records import DrafterStatus
from specserve.platform.state.redis_server import DataDirInUse, EmbeddedRedis, find_redis_server
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.registry import Registry, VariantSpec
from specserve.platform.state.store import StoreError
from specserve.policies.settings import PolicySettings

pytestmark = pytest.mark.timeout(60)


def _spec(name: str, digest: str = "0") -> VariantSpec:
    return VariantSpec(
        name=name, base_model="m", adapter_path=f"/a/{name}", adapter_sha256=digest * 64
    )


def _fill(registry: Registry) -> None:
    """Two variants, a second version, a drafter status, an override and the policy settings."""
    registry.register(_spec("bot"))
    second = registry.register(_spec("bot", "1"))
    registry.register(_spec("other"))
    registry.set_drafter(second.key, DrafterStatus(kind="eagle", state="succeeded", tau=3.1))
    registry.set_override("other", "lookahead")
    registry.set_policy_settings(PolicySettings(stability_window_s=7.0))


def _snapshot(registry: Registry) -> tuple:
    names = registry.names()
    return (
        names,
        registry.list(),
        [registry.variant(n) for n in names],
        registry.overrides(),
        registry.policy_settings(),
        registry.generation(),
    )


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _until(check, timeout_s: float, every_s: float = 0.02):
    """The first truthy `check()` within `timeout_s` (a StoreError counts as not yet), else None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = check()
        except StoreError:
            found = None
        if found:
            return found
        time.sleep(every_s)
    return None


def test_the_registry_survives_a_restart_of_the_app(tmp_path):
    settings = StoreSettings(embedded_data_dir=tmp_path / "cache" / "redis")
    with resolve_store(settings) as stores:
        assert stores.durable() is True and stores.registry.durable() is True  # its AOF
        _fill(Registry(stores.registry))
        before = _snapshot(Registry(stores.registry))
        first_url = stores.redis_url
    assert before[0] == ["bot", "other"]
    with resolve_store(settings) as stores:  # a new server: new port and password, same AOF
        assert stores.redis_url != first_url
        assert _snapshot(Registry(stores.registry)) == before


def test_without_a_data_dir_nothing_is_kept():
    server = EmbeddedRedis().start()
    try:
        Registry(RedisStore(server.url)).register(_spec("bot"))
        server.stop()
        server.start()
        assert Registry(RedisStore(server.url)).names() == []
    finally:
        server.stop()


def test_a_killed_server_is_restarted_with_its_data(tmp_path):
    server = EmbeddedRedis(data_dir=tmp_path / "redis", supervise=True).start()
    try:
        registry = Registry(RedisStore(server.url, socket_timeout_s=0.5, connect_timeout_s=0.25))
        _fill(registry)
        before = _snapshot(registry)
        time.sleep(1.2)  # appendfsync everysec: on disk now
        port, old_pid = server.port, server.pid
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        assert _until(registry.names, 5.0) == before[0]  # works again by itself
        recovered_s = time.monotonic() - killed_at
        assert recovered_s < 5.0 and server.port == port and server.pid != old_pid
        assert _until(lambda: server.restarts == 1, 1.0)
        assert not os.path.exists(f"/proc/{old_pid}")  # reaped, not left <defunct>
        assert _snapshot(registry) == before  # the Registry made before the kill works again
        assert registry.register(_spec("bot", "2")).version == 3
    finally:
        server.stop()


def test_health_returns_to_ok_by_itself(tmp_path):
    slow = ExponentialBackoff(cap=3.0, base=3.0)  # a 3 s outage: longer than health's 2 s cache
    server = EmbeddedRedis(data_dir=tmp_path / "redis", supervise=True, restart_backoff=slow)
    server.start()
    try:
        registry = Registry(RedisStore(server.url, socket_timeout_s=0.5, connect_timeout_s=0.25))
        gateway = Gateway(PlatformSettings(models=["m"]), registry, LocalBackend({}), Metrics())
        assert gateway.health()["status"] == "ok"
        os.kill(server.pid, signal.SIGKILL)
        assert _until(lambda: gateway.health()["status"] == "degraded", 2.8, every_s=0.1)
        assert _until(lambda: gateway.health()["status"] == "ok", 8.0, every_s=0.1)
        assert server.restarts == 1
    finally:
        server.stop()


def test_stop_is_not_taken_for_a_death():
    server = EmbeddedRedis(supervise=True, restart_backoff=ExponentialBackoff(cap=0.05, base=0.05))
    server.start()
    port = server.port
    assert os.getpgid(server.pid) != os.getpgid(0)  # a Ctrl-C to our process group misses it
    server.stop()
    time.sleep(0.5)  # ten times the restart backoff
    assert not server.running and server.restarts == 0 and _refused(port)
    assert not any(t.name.startswith("redis-supervisor") for t in threading.enumerate())


def test_one_data_dir_serves_one_server_at_a_time(tmp_path):
    with EmbeddedRedis(data_dir=tmp_path / "redis"), pytest.raises(DataDirInUse):
        EmbeddedRedis(data_dir=tmp_path / "redis").start()
    with EmbeddedRedis(data_dir=tmp_path / "redis") as again:
        assert again.running


def test_failed_restarts_back_off_and_the_server_comes_back(tmp_path, caplog):
    backoff = ExponentialBackoff(cap=0.8, base=0.4)  # 0.4 s, then 0.8 s, 0.8 s, ...
    server = EmbeddedRedis(data_dir=tmp_path / "redis", supervise=True, restart_backoff=backoff)
    server.start()
    try:
        writer = RedisStore(server.url)
        writer.set("k", "v")
        writer.close()  # no connection at the kill: no TIME_WAIT on the port
        time.sleep(1.2)
        port = server.port
        with caplog.at_level("WARNING", logger="specserve.platform.state.redis_server"):
            os.kill(server.pid, signal.SIGKILL)
            squatter = socket.socket()
            assert _until(lambda: _refused(port), 0.3, every_s=0.01)
            squatter.bind(("127.0.0.1", port))  # the restarts cannot bind while this holds it
            time.sleep(2.5)
            squatter.close()
            assert _until(lambda: server.restarts == 1, 3.0)
        failed = [r.created for r in caplog.records if "restart on port" in r.getMessage()]
        assert 2 <= len(failed) <= 4  # backed off, not a busy loop
        assert all(b - a >= 0.75 for a, b in itertools.pairwise(failed))
        assert RedisStore(server.url).get("k") == "v"
    finally:
        server.stop()


def test_the_data_dir_keeps_to_the_server_that_wrote_it(tmp_path, monkeypatch):
    """Its AOF may not load in another server (Valkey 9's in Redis 7): a data directory names its
    binary, which is used again while it exists, even with that name gone from the lookup."""
    binary = find_redis_server()
    settings = StoreSettings(embedded_data_dir=tmp_path / "redis")
    with resolve_store(settings) as stores:
        _fill(Registry(stores.registry))
        before = _snapshot(Registry(stores.registry))
    assert (tmp_path / "redis" / SERVER_FILE).read_text().strip() == binary
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # neither PATH nor the venv has one now
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    assert find_redis_server() is None
    with resolve_store(settings) as stores:
        assert stores.embedded.binary == binary
        assert _snapshot(Registry(stores.registry)) == before
