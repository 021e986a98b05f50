"""`specserve up`'s store: without a Redis (no REDIS_URL, no redis-server) it stops before
anything starts, with an error naming the remedies; `--store memory` is the only way to the memory
store; the log line names the store and whether it is durable; replicas learn which Redis it is."""

from __future__ import annotations

import pytest
import ray

from specserve.cli import build_parser
from specserve.paths import config_file
from specserve.platform.rayserve.up import admin_token_file, open_store, up
from specserve.platform.settings import PlatformSettings
from specserve.platform.state import embedded

REMEDIES = ("scripts/setup.sh", "apt-get install redis-server", "REDIS_URL", "--store memory")


@pytest.fixture
def no_redis(monkeypatch):
    """No REDIS_URL and no redis-server binary anywhere."""
    for name in ("REDIS_URL", "SPECSERVE_POOL_REDIS_URL", "SPECSERVE_REDIS_EMBEDDED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(embedded, "find_redis_server", lambda binary: None)


def test_up_without_a_redis_stops_at_once_naming_the_remedies(no_redis, tmp_path):
    lines = []
    rc = up(config_file("serve.yaml"), "127.0.0.1", 1, tmp_path / "cache", 1, log=lines.append)
    assert rc == 2
    (error,) = [line for line in lines if line.startswith("error: ")]
    assert "no Redis" in error and all(remedy in error for remedy in REMEDIES)
    assert not ray.is_initialized() and not admin_token_file(tmp_path / "cache").exists()


def test_the_memory_store_only_when_chosen(no_redis, tmp_path):
    settings = PlatformSettings.from_args({"store": "memory"}, env={})
    lines = []
    stores, env = open_store(settings, tmp_path, log=lines.append)
    assert stores is None and env == {"SPECSERVE_REDIS_EMBEDDED": "0"}
    assert "store: memory" in lines[0] and "durable: no" in lines[0]
    with pytest.raises(embedded.NoRedisServer):
        open_store(PlatformSettings.from_args({}, env={}), tmp_path, log=lines.append)


def test_the_embedded_redis_is_named_durable_and_told_to_replicas(tmp_path):
    settings = PlatformSettings.from_args({}, env={})
    lines = []
    stores, env = open_store(settings, tmp_path, log=lines.append)
    try:
        assert stores.kind == "redis-embedded" and stores.embedded.data_dir == tmp_path / "redis"
        assert env == {"REDIS_URL": stores.redis_url, "SPECSERVE_REDIS_EMBEDDED": "1"}
        assert lines[0].startswith("store: redis-embedded: redis://:***@127.0.0.1:")
        assert "durable: yes" in lines[0] and stores.embedded.password not in lines[0]
        replica = PlatformSettings.from_args({}, env=env)
        assert replica.redis_embedded and replica.redis_url == stores.redis_url
    finally:
        stores.close()


def test_an_external_redis_is_named_with_its_durability(redis_server, tmp_path):
    settings = PlatformSettings.from_args({}, env={"REDIS_URL": redis_server.url})
    lines = []
    stores, env = open_store(settings, tmp_path, log=lines.append)
    stores.close()
    assert stores.kind == "redis-external" and env == {"SPECSERVE_REDIS_EMBEDDED": "0"}
    assert "store: redis-external" in lines[0] and "durable: no" in lines[0]
    assert redis_server.running  # a given Redis is not stopped


def test_the_store_flag():
    parse = build_parser().parse_args
    assert parse(["up"]).store is None  # the config's `store` arg, redis by default
    assert parse(["up", "--store", "memory"]).store == "memory"
    with pytest.raises(SystemExit):
        parse(["up", "--store", "sqlite"])
