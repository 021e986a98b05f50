"""The stores of a platform running on Ray: the Redis of the settings, else one in-cluster
MemoryStore in a named Ray actor shared by every replica and job (`platform_stores`)."""

from __future__ import annotations

from specserve.platform.settings import PlatformSettings
from specserve.platform.state.store import Store


def platform_stores(settings: PlatformSettings) -> tuple[Store, Store]:
    """(registry store, pool store): the Redis of REDIS_URL / SPECSERVE_POOL_REDIS_URL, else the
    cluster's memory store for both (needs `ray.init()` first)."""
    from specserve.platform.state.embedded import StoreSettings, ray_memory_store, resolve_store

    if settings.redis_url:
        stores = resolve_store(
            StoreSettings(redis_url=settings.redis_url, pool_redis_url=settings.pool_redis_url)
        )
        return stores.registry, stores.pools
    store = ray_memory_store()
    return store, store
