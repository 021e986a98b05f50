"""Shared n-gram pools: replicas share through the store, start warm, stay per variant@version,
and keep serving from local pools through a Redis outage, resyncing by themselves afterwards."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from specserve.adapters.variants import PoolBook, VariantKey
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.pool_sync import PoolSync, PoolSyncSettings, decode, encode
from specserve.platform.state.redis_store import RedisStore

V1, V2 = VariantKey("support-bot", 1), VariantKey("support-bot", 2)
FAST = PoolSyncSettings(interval_s=0.05, max_backoff_s=0.2, max_entries=1000, ttl_s=60)


def book() -> PoolBook:
    return PoolBook(max_pools=8, max_keys=1000, journal_size=1000)


def wait_for(predicate, timeout_s=5.0, step_s=0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


@pytest.fixture(params=["redis", "memory"])
def shared(request):
    """A store that several in-process "replicas" share."""
    if request.param == "redis":
        return request.getfixturevalue("redis_store")
    return MemoryStore()


def test_encoding_round_trip():
    assert encode((5, 6), (7,)) == "5,6|7" and decode("5,6|7") == ((5, 6), (7,))
    assert decode("garbage") is None and decode("1,x|2") is None


def test_needs_a_journaling_book():
    with pytest.raises(ValueError, match="journal_size"):
        PoolSync(MemoryStore(), PoolBook())


def test_replicas_share_pools_per_version_and_start_warm(shared):
    book_a, book_b = book(), book()
    with (
        PoolSync(shared, book_a, FAST, base_model="m") as a,
        PoolSync(shared, book_b, FAST, base_model="m") as b,
    ):
        book_a.pool(V1).add_ngrams([1, 2, 3, 4, 5, 6], key_len=2, cont_len=2)
        book_a.pool(None).add((9, 9), (8, 8))  # the base model's pool
        book_b.pool(V1).add((40, 41), (42,))
        book_b.pool(None)
        assert a.sync_now() and b.sync_now() and a.sync_now()
        assert book_b.pool(V1).get((1, 2), 4) == [(3, 4)]
        assert book_b.pool(V1).get((3, 4), 4) == [(5, 6)]
        assert book_b.pool(None).get((9, 9), 4) == [(8, 8)]
        assert book_a.pool(V1).get((40, 41), 4) == [(42,)]  # merged both ways
        assert a.health()["status"] == "ok" and a.health()["pools"] == 2
        assert a.counters()["pushes"] >= 2 and b.counters()["pulled_ngrams"] >= 3

        book_c = book()
        with PoolSync(shared, book_c, FAST, base_model="m") as c:
            assert c.warm_start(V1)  # a new replica: warm for v1 at once
            assert book_c.pool(V1).get((1, 2), 4) == [(3, 4)]
            assert book_c.pool(V1).get((40, 41), 4) == [(42,)]
            assert c.warm_start(V2)
            assert book_c.pool(V2).num_keys == 0  # a new version starts cold


def test_pulled_ngrams_are_not_pushed_back(shared):
    book_a, book_b = book(), book()
    with PoolSync(shared, book_a, FAST) as a, PoolSync(shared, book_b, FAST) as b:
        book_a.pool(V1).add((1,), (2,))
        book_b.pool(V1)
        assert a.sync_now() and b.sync_now()
        pushes = b.counters()["pushed_ngrams"]
        assert b.sync_now() and b.sync_now()
        assert book_b.pool(V1).get((1,), 1) == [(2,)]
        assert b.counters()["pushed_ngrams"] == pushes == 0


def test_shared_pool_is_bounded_and_expires(redis_server, redis_store):
    settings = PoolSyncSettings(interval_s=60, max_entries=50, ttl_s=30)
    local = book()
    sync = PoolSync(redis_store, local, settings).start()
    try:
        local.pool(V1).add_ngrams(list(range(200)), key_len=1, cont_len=1)  # 199 n-grams
        assert sync.sync_now()
        raw = redis.Redis.from_url(redis_server.url)
        key = sync.redis_key(V1)
        assert key == "specserve:pool:v:support-bot@1"
        assert raw.zcard(key) == 50  # the most recent 50
        assert raw.zscore(key, encode((198,), (199,))) and raw.zscore(key, "0|1") is None
        assert 0 < raw.pttl(key) <= 30_000
        raw.close()
    finally:
        sync.stop()


def _max_op_ms(pool, rounds=300) -> float:
    worst = 0.0
    for i in range(rounds):
        t = time.perf_counter()
        pool.add_ngrams([i % 50, (i + 1) % 50, (i + 2) % 50, 7, 8], key_len=2, cont_len=2)
        pool.get((i % 50, (i + 1) % 50), 4)
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.001)
    return worst * 1000


def test_redis_outage_degrades_and_resyncs_by_itself(redis_server):
    store_a = RedisStore(redis_server.url, socket_timeout_s=0.3, connect_timeout_s=0.3)
    store_b = RedisStore(redis_server.url, socket_timeout_s=0.3, connect_timeout_s=0.3)
    book_a, book_b = book(), book()
    a = PoolSync(store_a, book_a, FAST).start()
    b = PoolSync(store_b, book_b, FAST).start()
    try:
        book_a.pool(V1).add((1, 1), (1,))
        book_b.pool(V1)
        assert a.sync_now() and b.sync_now()
        assert book_b.pool(V1).get((1, 1), 1) == [(1,)]

        port, password = redis_server.port, redis_server.password
        redis_server.stop()
        assert wait_for(lambda: a.health()["status"] == "degraded")
        health = a.health()
        assert health["last_error"] and health["degraded_since"] is not None
        # inference keeps using the local pool, never waiting on the store
        assert _max_op_ms(book_a.pool(V1)) < 20
        book_a.pool(V1).add((2, 2), (2,))  # learnt during the outage
        assert book_a.pool(V1).get((2, 2), 1) == [(2,)]
        assert a.counters()["failures"] >= 1 and not a.sync_now(timeout_s=2)

        # the same server address comes back, empty (no persistence): no object is re-created
        redis_server.start()
        assert (redis_server.port, redis_server.password) == (port, password)
        assert wait_for(lambda: a.health()["status"] == "ok", timeout_s=10)
        assert wait_for(lambda: b.health()["status"] == "ok", timeout_s=10)
        assert a.health()["degraded_since"] is None
        assert wait_for(lambda: book_b.pool(V1).get((2, 2), 1) == [(2,)], timeout_s=5)
        # after the resync, even n-grams learnt before the outage are in the (new, empty) store
        book_c = book()
        with PoolSync(RedisStore(redis_server.url), book_c, FAST) as c:
            assert c.warm_start(V1)
            assert book_c.pool(V1).get((1, 1), 1) == [(1,)]
    finally:
        a.stop()
        b.stop()
        store_a.close()
        store_b.close()


def test_a_hung_redis_never_blocks_local_pools(redis_server):
    """SIGSTOP: the server accepts nothing and answers nothing; only the sync thread waits."""
    store = RedisStore(redis_server.url, socket_timeout_s=0.3, connect_timeout_s=0.3)
    local = book()
    sync = PoolSync(store, local, FAST).start()
    try:
        local.pool(V1).add((1,), (2,))
        assert sync.sync_now()
        os.kill(redis_server.pid, signal.SIGSTOP)
        try:
            assert _max_op_ms(local.pool(V1)) < 20
            assert wait_for(lambda: sync.health()["status"] == "degraded")
            assert "Timeout" in sync.health()["last_error"]
        finally:
            os.kill(redis_server.pid, signal.SIGCONT)
        assert wait_for(lambda: sync.health()["status"] == "ok", timeout_s=10)
    finally:
        sync.stop()
        store.close()


class _SlowStore(MemoryStore):
    """Pulls take `delay_s`: a round is always running when the test asks for one."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def pool_pull(self, key, since, limit):
        time.sleep(self.delay_s)
        return super().pool_pull(key, since, limit)


def test_warm_start_waits_for_a_round_that_sees_the_new_pool():
    store = _SlowStore(0.05)
    store.pool_push("specserve:pool:v:support-bot@2", [encode((1,), (2,))], cap=10, ttl_s=60)
    local = book()
    local.pool(V1)
    with PoolSync(store, local, PoolSyncSettings(interval_s=0.01)) as sync:
        for _ in range(5):  # rounds run back to back; each warm start lands during one
            time.sleep(0.02)
        assert sync.warm_start(V2, timeout_s=5)
        assert local.pool(V2).get((1,), 1) == [(2,)]


def test_stop_then_start_again():
    store, local = MemoryStore(), book()
    sync = PoolSync(store, local, FAST)
    assert not sync.sync_now(timeout_s=0.1)  # not started: nothing syncs
    sync.start()
    sync.stop()
    sync.start()
    try:
        local.pool(V1).add((1,), (2,))
        assert sync.sync_now()
        assert store.pool_pull(sync.redis_key(V1), 0, 10)[0] == ["1|2"]
    finally:
        sync.stop()
