"""The Store contract, run on RedisStore (real redis-server), MemoryStore and CallStore alike."""

from __future__ import annotations

import threading
import time

import pytest

from specserve.platform.state.store import StoreError


def test_documents_and_counters(store):
    store.ping()
    assert store.get("t:a") is None
    store.set("t:a", "x")
    assert store.get("t:a") == "x"
    assert store.incr("t:n") == 1 and store.incr("t:n", 5) == 6 and store.get("t:n") == "6"
    assert store.delete("t:a", "t:n", "t:missing") == 2
    assert store.get("t:a") is None and store.delete() == 0


def test_maps(store):
    assert store.hgetall("t:m") == {} and store.hget("t:m", "f") is None
    store.hset("t:m", {"f": "1", "g": "2"})
    store.hset("t:m", {"g": "3"})
    assert store.hgetall("t:m") == {"f": "1", "g": "3"} and store.hget("t:m", "g") == "3"
    assert store.hdel("t:m", "f", "nope") == 1
    assert store.hdel("t:m", "g") == 1 and store.hgetall("t:m") == {}
    assert store.delete("t:m") == 0  # an emptied map no longer exists


def test_hkeys_and_hgetall_many_read_many_maps_at_once(store):
    store.hset("t:a", {"f": "1", "g": "2"})
    store.hset("t:b", {"h": "3"})
    assert sorted(store.hkeys("t:a")) == ["f", "g"] and store.hkeys("t:missing") == []
    got = store.hgetall_many(["t:b", "t:missing", "t:a"])
    assert got == [{"h": "3"}, {}, {"f": "1", "g": "2"}]
    assert store.hgetall_many([]) == []
    store.set("t:s", "x")
    with pytest.raises(StoreError):
        store.hgetall_many(["t:a", "t:s"])
    with pytest.raises(StoreError):
        store.hkeys("t:s")


def test_hincr_adds_all_fields_at_once(store):
    assert store.hincr("t:h", {"a": 2, "b": 3}) == {"a": 2, "b": 3}
    assert store.hincr("t:h", {"a": 1, "c": 0}) == {"a": 3, "c": 0}
    assert store.hgetall("t:h") == {"a": "3", "b": "3", "c": "0"}


def test_wrong_type_is_a_store_error(store):
    store.set("t:s", "x")
    with pytest.raises(StoreError):
        store.hgetall("t:s")
    with pytest.raises(StoreError):
        store.incr("t:s")


def test_add_version_counts_stores_and_indexes_once(store):
    assert store.add_version("t:seq", "t:vers", "t:idx", "a", "r1") == 1
    assert store.add_version("t:seq", "t:vers", "t:idx", "a", "r2") == 2
    assert store.hgetall("t:vers") == {"1": "r1", "2": "r2"}
    assert store.hgetall("t:idx") == {"a": "r1"}  # the index keeps its first record
    assert store.add_version("t:seq", "t:vers", "t:idx", "b", "r3", "t:gen") == 3
    assert store.get("t:gen") == "1" and store.hgetall("t:idx") == {"a": "r1", "b": "r3"}
    store.hset("t:bad-counter", {"f": "1"})
    with pytest.raises(StoreError):
        store.add_version("t:seq", "t:vers", "t:idx", "c", "r4", "t:bad-counter")
    assert store.get("t:seq") == "3"  # nothing was written


def test_remove_fields_and_keys_together(store):
    store.hset("t:idx", {"a": "1", "b": "2"})
    store.set("t:doc", "x")
    store.hset("t:map", {"f": "1"})
    assert store.remove([("t:idx", "a"), ("t:idx", "zz")], ["t:doc", "t:map"]) == [True, False]
    assert store.hgetall("t:idx") == {"b": "2"}
    assert store.get("t:doc") is None and store.hgetall("t:map") == {}
    store.set("t:doc", "y")
    assert store.remove([("t:idx", "b")], ["t:doc"], "t:gen") == [True]
    assert store.get("t:gen") == "1" and store.get("t:doc") is None
    assert store.remove([], [], "t:gen") == [] and store.get("t:gen") == "2"


def test_concurrent_add_version_gives_consecutive_versions(store):
    got, barrier = [], threading.Barrier(20)

    def work():
        barrier.wait(5)
        got.append(store.add_version("t:seq", "t:vers", "t:idx", "a", "r"))

    threads = [threading.Thread(target=work) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(got) == list(range(1, 21))
    assert sorted(map(int, store.hgetall("t:vers"))) == list(range(1, 21))


def test_pool_scores_grow_and_pulls_are_incremental(store):
    s1 = store.pool_push("t:p", ["a", "b"], cap=10, ttl_s=60)
    s2 = store.pool_push("t:p", ["c"], cap=10, ttl_s=60)
    assert s2 > s1 > 0
    members, since = store.pool_pull("t:p", 0, limit=10)
    assert sorted(members[:2]) == ["a", "b"] and members[2] == "c" and since == s2
    assert store.pool_pull("t:p", since, 10) == ([], since)  # nothing newer
    s3 = store.pool_push("t:p", ["a"], cap=10, ttl_s=60)  # refreshed: now the newest
    assert store.pool_pull("t:p", since, 10) == (["a"], s3)
    assert store.pool_pull("t:p", 0, 10)[0][-1] == "a"
    assert store.pool_pull("t:missing", 7, 10) == ([], 7)


def test_pool_keeps_the_most_recent_cap_and_limit_takes_the_newest(store):
    for m in ["a", "b", "c", "d"]:
        store.pool_push("t:p", [m], cap=3, ttl_s=60)
    assert store.pool_pull("t:p", 0, 10)[0] == ["b", "c", "d"]  # "a", least recent, evicted
    store.pool_push("t:p", ["b"], cap=3, ttl_s=60)
    store.pool_push("t:p", ["e"], cap=3, ttl_s=60)
    assert store.pool_pull("t:p", 0, 10)[0] == ["d", "b", "e"]  # "c" evicted, "b" refreshed
    members, since = store.pool_pull("t:p", 0, 2)
    assert members == ["b", "e"] and since == store.pool_pull("t:p", 0, 10)[1]


def test_pool_expires_after_its_last_push(store):
    store.pool_push("t:p", ["a"], cap=10, ttl_s=0.3)
    store.pool_push("t:p", ["b"], cap=10, ttl_s=0.3)  # each push restarts the clock
    assert len(store.pool_pull("t:p", 0, 10)[0]) == 2
    deadline = time.monotonic() + 3
    while store.pool_pull("t:p", 0, 10)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.pool_pull("t:p", 0, 10)[0] == []


def test_pool_ops_on_a_map_and_back_are_store_errors(store):
    store.hset("t:m", {"f": "1"})
    store.pool_push("t:p", ["a"], cap=3, ttl_s=60)
    with pytest.raises(StoreError):
        store.pool_push("t:m", ["a"], cap=3, ttl_s=60)
    with pytest.raises(StoreError):
        store.hgetall("t:p")


def test_samples_are_bounded_and_oldest_first(store):
    scores = [store.sample_push("t:s", m, cap=3, retention_s=60) for m in "abcd"]
    assert scores == sorted(scores) and len(set(scores)) == 4
    assert store.sample_pull("t:s", 60, 10) == ["b", "c", "d"]  # "a", the oldest, dropped
    assert store.sample_pull("t:s", 60, 2) == ["c", "d"]
    assert store.sample_pull("t:missing", 60, 10) == []


def test_samples_are_written_only_while_every_guard_field_exists(store):
    guards = [("t:g1", "on"), ("t:g2", "1")]
    store.hset("t:g1", {"on": "1"})
    assert store.sample_push("t:s", "a", cap=5, retention_s=60, guards=guards) is None
    store.hset("t:g2", {"1": "x"})
    assert store.sample_push("t:s", "b", cap=5, retention_s=60, guards=guards) is not None
    store.hdel("t:g1", "on")
    assert store.sample_push("t:s", "c", cap=5, retention_s=60, guards=guards) is None
    assert store.sample_pull("t:s", 60, 10) == ["b"]


def test_samples_older_than_the_retention_are_never_read(store):
    store.sample_push("t:s", "old", cap=5, retention_s=60)
    time.sleep(0.3)
    store.sample_push("t:s", "new", cap=5, retention_s=60)
    assert store.sample_pull("t:s", 0.2, 10) == ["new"]  # pruned, not only hidden
    assert store.sample_pull("t:s", 60, 10) == ["new"]
    store.sample_push("t:e", "x", cap=5, retention_s=0.2)
    deadline = time.monotonic() + 3
    while store.sample_pull("t:e", 60, 10) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.sample_pull("t:e", 60, 10) == []  # the set expired after its last push
