"""Which store to use: `REDIS_URL` -> that Redis; else a private, supervised `redis-server`
(`EmbeddedRedis`; its AOF in `embedded_data_dir`, or nothing kept without one) when the binary
exists; else the in-process `MemoryStore`, said in a log line. Settings come in, none are global.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specserve.platform.settings import Environment
from specserve.platform.state.call_store import CallStore
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_server import EmbeddedRedis
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
            settings.redis_server_binary,
            data_dir=settings.embedded_data_dir,
            supervise=True,
            start_timeout_s=settings.embedded_start_timeout_s,
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
