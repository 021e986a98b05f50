"""The registry at scale: store calls per registration and per listing do not grow with the
variant count, /v1/models lists 1,000 variants fast from a cache that every change invalidates
(also from another replica), and the admin variant list is paged."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from specserve.adapters.settings import AdapterLimits
from specserve.platform.api.admin import Admin, admin_router
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.settings import PlatformSettings, TenantKeys
from specserve.platform.state.call_store import CallStore
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.registry import Registry, VariantSpec
from specserve.policies.settings import PolicySettings

BASE = "base-m"
TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def spec(name: str, base: str = BASE) -> VariantSpec:
    return VariantSpec(
        name=name, base_model=base, adapter_path=f"/adapters/{name}", adapter_sha256="ab" * 32
    )


def fill(registry: Registry, count: int, prefix: str = "v") -> list[str]:
    names = [f"{prefix}{i:04d}" for i in range(count)]
    for name in names:
        registry.register(spec(name))
    return names


class Counted:
    """A `CallStore` call target that records every store method called, then runs it on a
    MemoryStore."""

    def __init__(self) -> None:
        self.target, self.calls = MemoryStore(), []

    def __call__(self, method: str, *args):
        self.calls.append(method)
        return getattr(self.target, method)(*args)

    def during(self, fn) -> list[str]:
        self.calls.clear()
        fn()
        return list(self.calls)


def app_of(registry: Registry, tenants: dict[str, frozenset[str]] | None = None, tmp=None):
    """(client, gateway): the gateway and admin API on `registry`, with no model servers."""
    settings = PlatformSettings(
        models=[BASE], tenant_keys=TenantKeys(variants_by_key=tenants or {})
    )
    gateway = Gateway(settings, registry, LocalBackend({}), Metrics())
    limits = AdapterLimits(root=tmp or "/nonexistent")  # nothing here registers adapters
    admin = Admin(registry, TOKEN, {}, limits, PolicySettings())
    return TestClient(create_app(gateway, admin_router(admin))), gateway


def _ids(client, headers=None) -> list[str]:
    r = client.get("/v1/models", headers=headers or {})
    assert r.status_code == 200, r.text
    return [m["id"] for m in r.json()["data"]]


@pytest.mark.parametrize("count", [10, 500])
def test_store_calls_do_not_grow_with_the_variant_count(count):
    counted = Counted()
    registry = Registry(CallStore(counted))
    fill(registry, count)
    client, _ = app_of(registry)
    registering = counted.during(lambda: registry.register(spec("one-more")))
    assert registering == ["add_version"]  # one atomic step; nothing reads other variants
    assert counted.during(registry.list) == ["hkeys", "hgetall_many", "hgetall"]
    first = counted.during(lambda: _ids(client))
    assert first == ["get", "hkeys", "hgetall_many", "hgetall"]  # generation, then the list
    assert counted.during(lambda: _ids(client)) == ["get"]  # cached: the generation only
    page = counted.during(lambda: client.get("/admin/variants?limit=5", headers=ADMIN))
    assert page == ["hkeys", "hgetall_many", "hgetall", "get"]  # per page, not per variant
    shown = counted.during(lambda: client.get("/admin/variants/v0003", headers=ADMIN))
    assert shown == ["hgetall_many", "hget", "get"]  # the variant in one read, then the policy


def test_concurrent_calls_after_a_change_read_the_list_once():
    counted = Counted()
    registry = Registry(CallStore(counted))
    fill(registry, 200)
    _, gateway = app_of(registry)
    gateway.models(None)
    registry.register(spec("new"))
    counted.calls.clear()
    barrier = threading.Barrier(8)
    bodies = []

    def call():
        barrier.wait(5)
        bodies.append(gateway.models(None).body)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert counted.calls.count("hkeys") == 1 and counted.calls.count("get") == 8
    assert len(set(bodies)) == 1 and b'"id":"new"' in bodies[0]


def test_v1_models_lists_a_thousand_variants_fast_with_tenant_visibility():
    registry = Registry(MemoryStore())
    names = fill(registry, 1000)
    registry.register(spec("elsewhere", base="not-served"))
    owned = frozenset(names[:10])
    client, _ = app_of(registry, tenants={"key-a": owned, "key-b": frozenset({"zz"})})
    took = []
    for _ in range(20):
        start = time.perf_counter()
        listed = _ids(client)
        took.append(time.perf_counter() - start)
    assert listed == [BASE, *names[10:]]  # no key: tenants' variants and unserved ones hidden
    assert _ids(client, {"Authorization": "Bearer key-a"}) == [BASE, *names]
    assert _ids(client, {"Authorization": "Bearer key-b"}) == [BASE, *names[10:]]
    assert client.get("/v1/models", headers={"Authorization": "Bearer forged"}).status_code == 401
    assert sorted(took)[-2] < 0.5, took  # ~5 ms here; generous for slow machines


def test_the_cached_listing_follows_every_change_from_any_replica(store):
    replica_a, replica_b = Registry(store), Registry(store)  # two replicas on one store
    fill(replica_a, 3)
    client, _ = app_of(replica_a)
    assert _ids(client) == [BASE, "v0000", "v0001", "v0002"]
    replica_b.register(spec("new"))
    assert _ids(client) == [BASE, "new", "v0000", "v0001", "v0002"]
    replica_b.set_override("new", "prompt_lookup")
    replica_b.register(spec("v0001"))
    data = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert data["new"]["specserve"]["override"] == "prompt_lookup"
    assert data["v0001"]["specserve"]["version"] == 2
    replica_b.delete("v0000")
    assert _ids(client) == [BASE, "new", "v0001", "v0002"]


def test_the_listing_keeps_its_last_variants_while_the_store_is_down(redis_server):
    store = RedisStore(redis_server.url, socket_timeout_s=0.3, connect_timeout_s=0.2)
    registry = Registry(store)
    fill(registry, 3)
    client, gateway = app_of(registry)
    assert len(_ids(client)) == 4
    redis_server.stop()
    assert _ids(client) == [BASE, "v0000", "v0001", "v0002"]  # as resolution: the last known
    start = time.perf_counter()
    assert len(_ids(client)) == 4
    assert time.perf_counter() - start < 0.2  # backs off: no wait on the dead store each call
    redis_server.start()  # restarted empty
    gateway.breaker.reset()
    assert _ids(client) == [BASE]
    store.close()


def test_admin_variant_list_is_paged_in_name_order(tmp_path):
    registry = Registry(MemoryStore())
    names = fill(registry, 250)
    client, _ = app_of(registry, tmp=tmp_path)
    first = client.get("/admin/variants", headers=ADMIN).json()
    assert len(first["variants"]) == 100 and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == ("v0000", "v0099")
    assert first["variants"][7] == client.get("/admin/variants/v0007", headers=ADMIN).json()
    seen, after, pages = [], None, 0
    while True:
        query = "limit=120" + (f"&after={after}" if after else "")
        page = client.get(f"/admin/variants?{query}", headers=ADMIN).json()
        seen += [v["name"] for v in page["variants"]]
        after, pages = page["last_id"], pages + 1
        if not page["has_more"]:
            break
    assert seen == names and pages == 3
    registry.delete("v0100")  # a cursor stays valid when its variant goes
    page = client.get("/admin/variants?limit=2&after=v0100", headers=ADMIN).json()
    assert [v["name"] for v in page["variants"]] == ["v0101", "v0102"]
    empty = client.get("/admin/variants?after=zzz", headers=ADMIN).json()
    assert empty["variants"] == [] and empty["has_more"] is False and empty["first_id"] is None
    for bad in ("limit=0", "limit=1001", "limit=x"):
        r = client.get(f"/admin/variants?{bad}", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
    assert client.get("/admin/variants?limit=1").status_code == 401


def test_registry_page_limits():
    registry = Registry(MemoryStore())
    fill(registry, 3)
    page = registry.page(2)
    assert [i.name for i in page.variants] == ["v0000", "v0001"] and page.has_more
    last = registry.page(2, after="v0001")
    assert [i.name for i in last.variants] == ["v0002"] and not last.has_more
    assert [i.name for i in registry.list(["v0002", "gone", "v0000"])] == ["v0002", "v0000"]
    for limit in (0, 1001):
        with pytest.raises(ValueError, match="limit"):
            registry.page(limit)
