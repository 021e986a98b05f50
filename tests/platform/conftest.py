"""Fixtures: a real redis-server per test (loopback, free port, password; stopped at teardown) and
the store contract's parametrization over RedisStore, MemoryStore and CallStore."""

from __future__ import annotations

import pickle

import pytest

from specserve.platform.state.call_store import CallStore
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_server import EmbeddedRedis
from specserve.platform.state.redis_store import RedisStore


@pytest.fixture
def redis_server():
    """A running EmbeddedRedis; the test may stop and restart it (same port and password)."""
    if EmbeddedRedis.find("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    server = EmbeddedRedis(start_timeout_s=10).start()
    yield server
    server.stop()


@pytest.fixture
def redis_store(redis_server):
    store = RedisStore(redis_server.url, socket_timeout_s=0.5, connect_timeout_s=0.25)
    yield store
    store.close()


def pickled_call_store() -> CallStore:
    """A CallStore whose calls cross a pickle boundary to a MemoryStore, as through a Ray actor."""
    target = MemoryStore()

    def call(method, *args):
        args = pickle.loads(pickle.dumps(args))
        return pickle.loads(pickle.dumps(getattr(target, method)(*args)))

    return CallStore(call, "pickled memory store")


@pytest.fixture(params=["redis", "memory", "call"])
def store(request):
    """Each Store implementation in turn (the same contract suite runs on all)."""
    if request.param == "redis":
        return request.getfixturevalue("redis_store")
    if request.param == "memory":
        return MemoryStore()
    return pickled_call_store()
