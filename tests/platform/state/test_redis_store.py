"""RedisStore beyond the shared contract: the password is required and never shown, and an
unreachable server fails fast."""

from __future__ import annotations

import time

import pytest

from specserve.platform.state.redis_store import RedisStore, mask_url
from specserve.platform.state.store import StoreUnavailable


def test_redis_store_needs_the_password(redis_server):
    assert redis_server.password in redis_server.url
    wrong = RedisStore(redis_server.url.replace(redis_server.password, "wrong"), retries=0)
    with pytest.raises(StoreUnavailable):
        wrong.get("x")
    none = RedisStore(f"redis://127.0.0.1:{redis_server.port}/0", retries=0)
    with pytest.raises(StoreUnavailable):
        none.get("x")
    good = RedisStore(redis_server.url)
    assert redis_server.password not in good.describe() and "***" in good.describe()
    good.set("x", "1")
    assert good.get("x") == "1"
    for s in (wrong, none, good):
        s.close()


def test_redis_store_unreachable_fails_fast(redis_server):
    store = RedisStore(redis_server.url, socket_timeout_s=0.3, connect_timeout_s=0.3)
    redis_server.stop()
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.pool_pull("p", 0, 10)
    assert time.monotonic() - start < 2.0
    store.close()


def test_mask_url():
    assert mask_url("redis://:s3cret@h:6379/1") == "redis://:***@h:6379/1"
    assert mask_url("redis://user:s3cret@h/0") == "redis://user:***@h/0"
    assert mask_url("redis://h:6379") == "redis://h:6379"
