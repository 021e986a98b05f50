"""The process finders against real processes: `python -c` children with recognizable command
lines and environments, and a real supervised redis-server (EmbeddedRedis) under a cache's
`redis` directory, found by directory and port, killed, and found again once restarted."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from specserve.platform.rayserve.up import embedded_redis_dir
from specserve.platform.state.redis_server import EmbeddedRedis
from specserve.tools.faults.procs import (
    REPLICA_TITLE,
    Scope,
    controllers,
    kill,
    listens_on,
    only,
    redis_servers,
    replicas,
    store_urls,
)

pytestmark = pytest.mark.timeout(60)
SLEEPER = "import time; time.sleep(60)"


@pytest.fixture
def spawn():
    """spawn(title, env) -> a `python -c` child whose argv carries `title`; ended after."""
    started: list[subprocess.Popen] = []

    def _spawn(title: str, **env: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", SLEEPER, title], env=os.environ | env, stdin=subprocess.DEVNULL
        )
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        proc.kill()
        proc.wait(10)


def test_replicas_found_by_title_within_the_scope(spawn, tmp_path):
    mine = spawn(f"ray::{REPLICA_TITLE}-tiny", SPECSERVE_CACHE=str(tmp_path / "a"))
    other = spawn(f"ray::{REPLICA_TITLE}-tiny", SPECSERVE_CACHE=str(tmp_path / "b"))
    spawn("ray::ServeReplica:specserve:Gateway")
    here = Scope(root_pid=os.getpid())
    assert {p.pid for p in replicas(here)} == {mine.pid, other.pid}
    by_cache = replicas(Scope(cache_dir=tmp_path / "a"))  # the whole table, one cache
    assert [p.pid for p in by_cache] == [mine.pid]
    with pytest.raises(LookupError, match="found 2"):
        only(replicas(here), "replica")
    assert controllers(here) == []


def test_kill_sends_sigkill_and_waits(spawn):
    proc = spawn("ray::ServeController")
    (found,) = controllers(Scope(root_pid=os.getpid()))
    assert kill(found) is True
    assert not psutil.pid_exists(proc.pid)  # reaped by kill(): it is our child
    assert controllers(Scope(root_pid=os.getpid())) == []


def test_store_urls_come_from_the_environment(spawn):
    url = "redis://:secret@127.0.0.1:1234/0"
    proc = spawn(REPLICA_TITLE, REDIS_URL=url)
    time.sleep(0.2)
    assert store_urls(psutil.Process(proc.pid))["REDIS_URL"] == url


def test_embedded_redis_found_by_its_directory_and_port_then_again_after_a_restart(tmp_path):
    cache = tmp_path / "cache"
    server = EmbeddedRedis(data_dir=embedded_redis_dir(cache), supervise=True).start()
    try:
        here = Scope(root_pid=os.getpid())
        (found,) = redis_servers(here, embedded_redis_dir(cache))
        assert found.pid == server.pid
        assert listens_on(found, server.port) and not listens_on(found, server.port + 1)
        assert redis_servers(here, tmp_path / "elsewhere" / "redis") == []
        assert kill(found)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            again = redis_servers(here, embedded_redis_dir(cache))
            if again and again[0].pid != found.pid:
                break
            time.sleep(0.1)
        assert [p.pid for p in again] == [server.pid] != [found.pid]
    finally:
        server.stop()
