"""Fault injection breaks the real engine loop: a killed loop thread is dead to the health check,
a hung one is reported stalled once it holds work; the route is off unless enabled."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
from specserve.models.load import load_model
from specserve.platform.api.faults import faults_router
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.faults import inject
from specserve.platform.service import ModelService
from specserve.platform.serving import resident_adapters
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings


@pytest.fixture
def service(tmp_path, save_tiny_model_dir, adapter_root):
    loaded = load_model(str(save_tiny_model_dir(tmp_path / "model")), dtype="float32")
    loaded.model_id = "tiny"
    adapters = resident_adapters(loaded, AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings()).start()
    yield service
    service.stop()


def _wait(predicate, timeout_s=10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_killed_engine_loop_is_dead_to_the_health_check(service, monkeypatch):
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # expected: not reported
    assert service.health(60.0).ok
    assert inject(service, "kill_engine_loop") == "engine loop thread killed"
    assert _wait(lambda: not service.scheduler.running)
    assert service.health(60.0).reason == "engine loop thread is dead"
    with pytest.raises(RuntimeError, match="not running"):
        inject(service, "kill_engine_loop")


def test_hung_engine_loop_is_stalled_once_it_holds_work(service):
    release = threading.Event()
    assert inject(service, "hang_engine_loop", release) == "engine loop hung"
    time.sleep(0.2)
    assert service.scheduler.running and service.health(0.1).ok  # hung but idle: nothing waits
    service.scheduler.call(lambda: None)  # work queued behind the hung call
    assert _wait(lambda: not service.health(0.1).ok)
    assert service.health(0.1).reason.startswith("engine loop stalled")
    release.set()
    assert _wait(lambda: service.health(0.1).ok)


@pytest.mark.parametrize("enabled", [False, True])
def test_fault_route_is_off_unless_enabled_and_needs_the_admin_token(service, enabled):
    settings = PlatformSettings(models=["tiny"], fault_injection=enabled)
    gateway = Gateway(settings, Registry(MemoryStore()), LocalBackend({"tiny": service}), Metrics())

    def check(request: Request):
        if request.headers.get("authorization") != "Bearer t":
            from specserve.platform.api.errors import ApiError

            raise ApiError(401, "no", "authentication_error", code="missing_token")

    client = TestClient(create_app(gateway, faults_router(gateway, check)))
    body = {"model": "tiny", "kind": "hang_engine_loop"}
    assert client.post("/admin/faults", json=body).status_code == 401
    auth = {"authorization": "Bearer t"}
    bad = client.post("/admin/faults", json=body | {"kind": "reboot"}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"
    reply = client.post("/admin/faults", json=body, headers=auth)
    if not enabled:
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
        return
    assert reply.status_code == 200 and reply.json()["done"] == "engine loop hung"
    service.scheduler._stop = True  # the hung loop never comes back: let the fixture's stop end

    unknown = client.post("/admin/faults", json=body | {"model": "x"}, headers=auth)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


def test_a_killed_loop_ends_every_request_it_held_and_refuses_new_ones(service, monkeypatch):
    """No stream waits forever on a dead loop: running and queued requests end with an error,
    later ones are refused at once (503 at the gateway), and no second loop is started."""
    import asyncio

    from specserve.engine.sampling import SamplingParams
    from specserve.platform.requests import GenerateRequest, Target
    from specserve.platform.service import Overloaded

    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # expected: not reported

    def request(i):
        params = SamplingParams(max_new_tokens=200, ignore_eos=True, temperature=1.0, seed=i)
        return GenerateRequest(target=Target(), prompt="w1 w2 w3", params=params, strategy="ar")

    async def consume(i, started):
        try:
            async for event in service.generate(request(i)):
                started.set()
            return "completed"
        except Exception as err:  # noqa: BLE001 - what the gateway turns into an error event
            return type(err).__name__

    async def run():
        started = asyncio.Event()
        tasks = [asyncio.create_task(consume(i, started)) for i in range(3)]
        await asyncio.wait_for(started.wait(), 30)
        inject(service, "kill_engine_loop")
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        with pytest.raises(Overloaded, match="engine loop thread died"):
            async for _ in service.generate(request(9)):
                pass
        return outcomes

    outcomes = asyncio.run(run())
    assert outcomes.count("completed") < 3 and "RuntimeError" in outcomes, outcomes
    assert not service.scheduler.running and service.health(60.0).reason == (
        "engine loop thread is dead"
    )
