"""The in-cluster store without Redis: a MemoryStore in a named Ray actor, shared by every process
of the cluster (here: the registry from two CallStores, as two replicas would)."""

from __future__ import annotations

import threading
import time

import pytest

from specserve.platform.state.embedded import ray_memory_store
from specserve.platform.state.registry import Registry, VariantSpec
from specserve.platform.state.store import StoreUnavailable

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():  # another module's Ray: use it, leave it running
        yield
        return
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="test-store")
    yield
    ray.shutdown()


def test_registry_on_the_actor_store(local_ray):
    a = ray_memory_store(name="store-under-test")
    b = ray_memory_store(name="store-under-test")  # found, not created again
    spec = VariantSpec(name="v", base_model="m", adapter_path="/a", adapter_sha256="e" * 64)
    ra, rb = Registry(a), Registry(b)
    threads = [threading.Thread(target=ra.register, args=(spec,)) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [v.version for v in rb.versions("v")] == list(range(1, 11))
    members, since = b.pool_pull("p", 0, 10)
    assert members == [] and since == 0
    ray.kill(ray.get_actor("store-under-test", namespace="specserve"))
    deadline = time.monotonic() + 20  # the kill is asynchronous
    with pytest.raises(StoreUnavailable):
        while time.monotonic() < deadline:
            a.get("x")
            time.sleep(0.05)
