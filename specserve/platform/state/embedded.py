"""Which store to use: `REDIS_URL` -> that Redis; else a private `redis-server` (`EmbeddedRedis`,
loopback, free port, random password, no persistence, stopped on close/atexit) when the binary
exists; else the in-process `MemoryStore`, said in a log line. Settings come in, none are global.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specserve.platform.settings import Environment
from specserve.platform.state.call_store import CallStore
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_store import RedisStore, mask_url
from specserve.platform.state.store import Store

log = logging.getLogger(__name__)


class StoreSettings(BaseModel):
    """Where the registry and the n-gram pools live, and how patiently to talk to them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    redis_url: SecretStr | None = Field(None, description="registry Redis (env REDIS_URL)")
    pool_redis_url: SecretStr | None = Field(
        None, description="n-gram pool Redis (env SPECSERVE_POOL_REDIS_URL); unset: redis_url"
    )
    redis_server_binary: str = Field(
        "redis-server", description="binary of the embedded server (a name on PATH or a path)"
    )
    socket_timeout_s: float = Field(1.0, gt=0)
    connect_timeout_s: float = Field(0.5, gt=0)
    embedded_start_timeout_s: float = Field(10.0, gt=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> StoreSettings:
        """The two URLs from `Environment.read(env)` (default: the process environment)."""
        read = Environment.read(env)
        return cls(
            **{"redis_url": read.redis_url, "pool_redis_url": read.pool_redis_url} | overrides
        )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the server gets SIGTERM when the process that started it dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedRedis:
    """A private redis-server on 127.0.0.1: `start()` waits until it answers PING, `stop()` (also
    at exit) ends it and removes its directory. `port`/`password` may be given to restart one on
    the same address; defaults: a free port and a random password. The config goes in on stdin,
    so the password is in no argv and no file."""

    def __init__(
        self,
        binary: str = "redis-server",
        *,
        port: int | None = None,
        password: str | None = None,
        maxmemory: str | None = None,
        maxmemory_policy: str = "noeviction",
        start_timeout_s: float = 10.0,
    ) -> None:
        self.binary = binary
        self.port = port
        self.password = password or secrets.token_urlsafe(24)
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None

    @staticmethod
    def find(binary: str) -> str | None:
        """The binary's path if it exists and is executable (a name is looked up on PATH)."""
        if os.sep in binary:
            return binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else None
        return shutil.which(binary)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _config(self) -> str:
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f"requirepass {self.password}",
            "protected-mode yes",
            'save ""',
            "appendonly no",
            f'dir "{self._dir}"',
            f'logfile "{self._dir / "redis.log"}"',
            f"maxmemory-policy {self.maxmemory_policy}",
        ]
        if self.maxmemory:
            lines.append(f"maxmemory {self.maxmemory}")
        return "\n".join(lines) + "\n"

    def start(self) -> EmbeddedRedis:
        path = self.find(self.binary)
        if path is None:
            raise FileNotFoundError(f"redis-server binary not found: {self.binary!r}")
        fixed_port = self.port is not None
        for attempt in range(3):  # a free port may be taken between choosing and binding
            if not fixed_port:
                self.port = free_port()
            try:
                self._launch(path)
                atexit.register(self.stop)
                return self
            except RuntimeError:
                self.stop()
                if fixed_port or attempt == 2:
                    raise
        return self  # unreachable

    def _launch(self, path: str) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="specserve-redis-"))
        # PR_SET_PDEATHSIG fires when the *thread* that forked ends: only from the main thread.
        main = threading.current_thread() is threading.main_thread()
        preexec = _die_with_parent if main and sys.platform.startswith("linux") else None
        self._proc = subprocess.Popen(
            [path, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=preexec,  # noqa: PLW1509 - prctl only, before exec
        )
        self._proc.stdin.write(self._config().encode())
        self._proc.stdin.close()
        client = redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=0.5
        )
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self._proc.returncode}: {self._log_tail()}"
                    )
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not answer within {self.start_timeout_s}s: "
                        f"{self._log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def _log_tail(self) -> str:
        try:
            return (self._dir / "redis.log").read_text()[-500:].strip()
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the server (SIGTERM, then SIGKILL) and remove its directory; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        atexit.unregister(self.stop)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Stores:
    """The stores of both roles and what started them. `redis_url` (secret) is what replicas in
    other processes need to reach the same Redis (None for the memory store)."""

    registry: Store
    pools: Store
    kind: str  # "redis" | "embedded" | "memory"
    redis_url: str | None = field(default=None, repr=False)  # holds the password
    pool_redis_url: str | None = field(default=None, repr=False)
    embedded: EmbeddedRedis | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def describe(self) -> str:
        if self.kind == "memory":
            return self.registry.describe()
        where = mask_url(self.redis_url or "")
        if self.pool_redis_url and self.pool_redis_url != self.redis_url:
            where += f", pools at {mask_url(self.pool_redis_url)}"
        return f"{self.kind}: {where}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for store in {id(self.registry): self.registry, id(self.pools): self.pools}.values():
            store.close()
        if self.embedded is not None:
            self.embedded.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _redis(url: str, settings: StoreSettings) -> RedisStore:
    return RedisStore(
        url,
        socket_timeout_s=settings.socket_timeout_s,
        connect_timeout_s=settings.connect_timeout_s,
    )


def ray_memory_store(
    name: str = "specserve-store",
    namespace: str = "specserve",
    timeout_s: float = 2.0,
    startup_timeout_s: float = 60.0,
) -> CallStore:
    """The in-cluster store without Redis: a `MemoryStore` in one named, detached Ray actor
    (created by the first caller, found by the others), reached through a `CallStore`.
    Needs `ray.init()` first. Its state lives as long as the actor (the Ray cluster)."""
    import ray

    actor = (
        ray.remote(MemoryStore)
        .options(
            name=name, namespace=namespace, lifetime="detached", get_if_exists=True, num_cpus=0
        )
        .remote()
    )
    ray.get(actor.ping.remote(), timeout=startup_timeout_s)  # its worker may take a while to start

    def call(method: str, *args):
        return ray.get(getattr(actor, method).remote(*args), timeout=timeout_s)

    return CallStore(call, f"ray actor {namespace}/{name}")


def resolve_store(settings: StoreSettings) -> Stores:
    """The stores to use (see the module docstring). The caller closes them (`Stores.close`)."""
    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    pool_url = settings.pool_redis_url.get_secret_value() if settings.pool_redis_url else None
    if url:
        registry = _redis(url, settings)
        pools = _redis(pool_url, settings) if pool_url and pool_url != url else registry
        stores = Stores(registry, pools, "redis", url, pool_url or url)
    elif EmbeddedRedis.find(settings.redis_server_binary):
        server = EmbeddedRedis(
            settings.redis_server_binary, start_timeout_s=settings.embedded_start_timeout_s
        ).start()
        registry = _redis(server.url, settings)
        pools = _redis(pool_url, settings) if pool_url else registry
        stores = Stores(registry, pools, "embedded", server.url, pool_url or server.url, server)
    else:
        log.warning(
            "store: no REDIS_URL and no %r binary: using the in-process memory store "
            "(state is lost on exit and shared only through one process or actor)",
            settings.redis_server_binary,
        )
        memory = MemoryStore()
        pools = _redis(pool_url, settings) if pool_url else memory
        return Stores(memory, pools, "memory", None, pool_url)
    log.info("store: %s", stores.describe())
    return stores
