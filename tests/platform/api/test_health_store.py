"""/healthz names the registry's store and whether it is durable: `store_kind` memory (in-process
or an actor's, never durable), redis-embedded (the server `specserve up` started: AOF, durable),
redis-external (REDIS_URL: durable as its own config says); `store` stays "ok" | "unreachable"."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_server import EmbeddedRedis
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.registry import Registry


def _health(registry_store, **settings) -> dict:
    gateway = Gateway(
        PlatformSettings(models=["m"], **settings),
        Registry(registry_store),
        LocalBackend({}),
        Metrics(),
    )
    r = TestClient(create_app(gateway)).get("/healthz")
    assert r.status_code == 200
    return r.json()


def test_the_memory_store_is_named_and_not_durable():
    body = _health(MemoryStore(), store="memory")
    assert body["status"] == "ok" and body["store"] == "ok"
    assert body["store_kind"] == "memory" and body["durable"] is False
    assert _health(MemoryStore())["store_kind"] == "memory"  # what it is, whatever the settings


def test_the_embedded_redis_with_its_aof_is_durable(tmp_path):
    with EmbeddedRedis(data_dir=tmp_path / "redis") as server:
        store = RedisStore(server.url)
        body = _health(store, redis_url=server.url, redis_embedded=True)
        store.close()
    assert body["store"] == "ok" and body["store_kind"] == "redis-embedded"
    assert body["durable"] is True


@pytest.mark.parametrize("aof", [False, True])
def test_an_external_redis_is_durable_as_its_config_says(tmp_path, aof):
    with EmbeddedRedis(data_dir=tmp_path / "redis" if aof else None) as server:
        store = RedisStore(server.url)
        body = _health(store, redis_url=server.url)
        store.close()
    assert body["store_kind"] == "redis-external" and body["durable"] is aof
    assert server.password not in str(body)
