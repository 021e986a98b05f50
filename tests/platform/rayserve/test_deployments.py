"""A replica's two adapter LRUs count to one number: Serve's multiplexing cache is sized by the
resident set's capacity, which is also the set's count cap, and Serve dropping a variant evicts
its adapter (routing itself is pinned on a local Ray by tests/e2e/test_multiplex_ray.py)."""

from __future__ import annotations

import asyncio
import pickle
import threading
from types import SimpleNamespace

import pytest
import torch

from specserve.adapters.memory import reference_adapter_bytes
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.adapters.variants import PoolBook
from specserve.models.load import load_model
from specserve.platform.batch_compile import BatchCompile
from specserve.platform.rayserve import deployments
from specserve.platform.service import ModelService
from specserve.platform.serving import resident_adapters
from specserve.policies.settings import PolicySettings


@pytest.fixture
def service(tmp_path, save_tiny_model_dir, adapter_root):
    loaded = load_model(str(save_tiny_model_dir(tmp_path / "model")), dtype="float32")
    loaded.model_id = "tiny"
    reference = reference_adapter_bytes(
        BaseModelSpec.of(loaded.model, ["tiny"]), loaded.model, torch.float32
    )
    limits = AdapterLimits(root=adapter_root, max_resident_bytes=2 * reference)
    adapters = resident_adapters(loaded, limits)
    return ModelService(loaded, adapters, PoolBook(), PolicySettings())


def test_serves_cache_is_the_resident_sets_count(service, monkeypatch, make_adapter):
    sizes = []

    def multiplexed(max_num_models_per_replica):
        sizes.append(max_num_models_per_replica)
        return lambda hook: hook

    monkeypatch.setattr(deployments.serve, "multiplexed", multiplexed)
    hold = deployments.variant_cache(service)
    assert sizes == [service.adapters.capacity] == [service.adapters.limits.max_resident] == [2]
    for i, name in enumerate(["a", "b", "c"]):  # one more than the cache holds
        path = make_adapter(name, service.adapters.model, seed=i, rank=1, base_name="tiny")
        service.adapters.ensure(f"{name}@1", path)
    assert service.adapters.names == ["b@1", "c@1"]  # the resident set never outgrows Serve's
    held = asyncio.run(hold("c@1"))
    held.__del__()  # Serve's unload of the variant
    assert service.adapters.names == ["b@1"]


def test_check_health_raises_once_the_engine_loop_is_dead(service, monkeypatch):
    """Serve replaces a replica whose check_health raises (no Ray here: the method itself)."""
    server = object.__new__(deployments.ModelServer.func_or_class)
    server.service, server.stall_s, server.model_id, server.replica = service, 60.0, "tiny", "r1"
    server.check_health()  # not started: healthy
    service.start()
    server.check_health()

    def exit_thread():
        raise SystemExit  # ends the loop thread, as an uncaught failure would

    monkeypatch.setattr(service.scheduler, "step", exit_thread)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # expected: not reported
    service.scheduler.call(lambda: None)  # wakes the loop: its next step exits
    service.scheduler._thread.join(timeout=10)
    with pytest.raises(RuntimeError, match="tiny: engine loop thread is dead"):
        server.check_health()


def test_stats_add_the_replicas_serve_cache_compile_state_and_pool_sync(service):
    """What crosses the Ray boundary to the gateway: a ReplicaStats, picklable as it is."""
    server = object.__new__(deployments.ModelServer.func_or_class)
    server.service, server.compile = service, BatchCompile()
    server.sync = SimpleNamespace(health=lambda: {"status": "degraded"}, stop=lambda: None)
    stats = pickle.loads(pickle.dumps(server.stats()))
    assert stats.adapters.variant_cache_size == service.adapters.capacity == 2
    assert stats.compile.status == "off" and stats.pools.sync_ok is False
    assert stats.batch.waiting == 0 and stats.numerics.dtype == "torch.float32"
    assert service.stats().pools is None and service.stats().compile is None
