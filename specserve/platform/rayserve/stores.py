"""The stores of a platform running on Ray: the Redis of the settings, or (`store: memory`, asked
for) one in-cluster MemoryStore in a named Ray actor shared by every replica and job
(`platform_stores`). Redis asked for and no REDIS_URL: `NoRedisServer`, never a silent fallback."""

from __future__ import annotations

from specserve.platform.settings import PlatformSettings
from specserve.platform.state.embedded import (
    NoRedisServer,
    StoreSettings,
    ray_memory_store,
    resolve_store,
)
from specserve.platform.state.store import Store


def platform_stores(settings: PlatformSettings) -> tuple[Store, Store]:
    """(registry store, pool store): the Redis of REDIS_URL / SPECSERVE_POOL_REDIS_URL; with
    `store: memory` the cluster's memory store for both (needs `ray.init()` first)."""
    if settings.store == "memory":
        store = ray_memory_store()
        return store, store
    if not settings.redis_url:  # `specserve up` sets it to its own server; k8s to its Redis
        raise NoRedisServer("REDIS_URL is unset in this process's environment")
    stores = resolve_store(
        StoreSettings(redis_url=settings.redis_url, pool_redis_url=settings.pool_redis_url)
    )
    return stores.registry, stores.pools
