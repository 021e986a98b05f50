"""Drafters from a variant's own traffic, end to end on a real Redis and a tiny served model: with
capture on, 50 served requests leave a bounded sample; a retrain from it scores the new drafter
and the current one on the same most recent (held-out) requests and installs the new one only
when it beats the current one, saying why in the registry; a refused candidate leaves the current
one serving; deleting the variant leaves no captured text in Redis or on disk."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.platform.api.admin import Admin, admin_router
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.rayserve.job_dirs import drafter_dir
from specserve.platform.rayserve.jobs import ThreadJobs
from specserve.platform.serving import build_service
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.registry import Registry
from specserve.platform.state.traffic import TrafficLog, TrafficSample
from specserve.policies.settings import PolicySettings

ADMIN = {"Authorization": "Bearer t"}
MARK = "zebra42"  # in every captured prompt: found anywhere after deletion = text outlived it


@pytest.fixture
def platform(tmp_path, save_tiny_model_dir, make_adapter, redis_server, redis_store, monkeypatch):
    """(HTTP client, gateway, registry, settings, redis store, cache dir): one variant `bot`."""
    model_dir = save_tiny_model_dir(tmp_path / "model")
    root = tmp_path / "root"
    root.mkdir()
    cache = tmp_path / "cache"
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("SPECSERVE_CACHE", str(cache))
    args = {"models": ["tiny"], "model_dirs": {"tiny": str(model_dir)}, "adapter_root": str(root)}
    args |= {"dtype": "float32", "max_tokens": 64}
    settings = PlatformSettings.from_args(args)
    service = build_service(settings, "tiny")
    base = service.loaded.model
    adapter = root / "v1"
    shutil.copytree(make_adapter("v1", base, seed=1, base_name="tiny"), adapter)
    registry = Registry(redis_store)
    policy = PolicySettings(auto_train=False)
    spec = BaseModelSpec.of(base, ["tiny"])
    admin = Admin(registry, "t", {"tiny": spec}, AdapterLimits(root=root), policy, ThreadJobs(args))
    gateway = Gateway(settings, registry, LocalBackend({"tiny": service}), Metrics())
    client = TestClient(create_app(gateway, admin_router(admin)))
    body = {"name": "bot", "base_model": "tiny", "adapter_path": str(adapter)}
    assert client.post("/admin/variants", headers=ADMIN, json=body).status_code == 201
    yield client, gateway, registry, settings, redis_store, cache
    service.stop()


def _serve(client, count: int) -> None:
    """`count` greedy requests of `bot`: chat and completions, some streamed."""
    for i in range(count):
        words = " ".join(f"w{3 + (i * 7 + j * j) % 50}" for j in range(6))
        if i % 2:
            body = {"model": "bot", "messages": [{"role": "user", "content": f"{MARK} {words}"}]}
            path = "/v1/chat/completions"
        else:
            body, path = {"model": "bot", "prompt": f"{MARK} {words}"}, "/v1/completions"
        body |= {"max_tokens": 12, "temperature": 0, "stream": i % 3 == 0}
        reply = client.post(path, json=body)
        assert reply.status_code == 200, reply.text


def _finished_retrain(client, kind: str, started_at: float | None = None) -> dict:
    deadline = time.time() + 240
    while time.time() < deadline:
        status = client.get("/admin/variants/bot/drafters", headers=ADMIN).json()[kind]
        last = (status.get("retrains") or [None])[-1]
        if last and last["state"] not in ("queued", "running") and last["started_at"] != started_at:
            return status
        time.sleep(0.5)
    raise AssertionError(f"no retrain finished: {status}")


def _train_first_drafter(client, kind: str) -> dict:
    body = {"kind": kind, "budget_minutes": 0.05}
    assert client.post("/admin/variants/bot/drafters", headers=ADMIN, json=body).status_code == 202
    deadline = time.time() + 240
    while time.time() < deadline:
        status = client.get("/admin/variants/bot/drafters", headers=ADMIN).json()[kind]
        if status["state"] not in ("queued", "running"):
            return status
        time.sleep(0.5)
    raise AssertionError(status)


def _strings_in_redis(store) -> str:
    """Every key and value in the Redis (any type), as one string."""
    client, out = store._client, []
    for key in client.scan_iter("*"):
        kind = client.type(key)
        value = {
            "string": lambda k: client.get(k),
            "hash": lambda k: client.hgetall(k),
            "zset": lambda k: client.zrange(k, 0, -1),
            "list": lambda k: client.lrange(k, 0, -1),
            "set": lambda k: client.smembers(k),
        }[kind](key)
        out.append(f"{key} {value}")
    return "\n".join(out)


@pytest.mark.timeout(400)
def test_retrain_from_traffic_replaces_only_a_better_drafter_and_deletion_erases_it(platform):
    client, gateway, registry, settings, store, cache = platform
    capture = {"enabled": True, "max_samples": 40, "retention_s": 3600}
    shown = client.put("/admin/variants/bot/capture", headers=ADMIN, json=capture).json()
    assert shown["enabled"] and shown["samples"] == 0
    first = _train_first_drafter(client, "medusa")
    assert first["state"] == "succeeded" and first["revision"] == 1, first

    _serve(client, 50)
    gateway.flush_traffic()
    samples = TrafficLog(registry).samples("bot")
    assert len(samples) == 40  # bounded: the 40 newest of 50
    assert all(MARK in (s.prompt or s.messages[0]["content"]) and s.output for s in samples)
    assert client.get("/admin/variants/bot/capture", headers=ADMIN).json()["samples"] == 40

    body = {"kind": "medusa", "from_traffic": True, "budget_minutes": 0.1}
    queued = client.post("/admin/variants/bot/drafters", headers=ADMIN, json=body)
    assert queued.status_code == 202 and queued.json()["retrains"][-1]["state"] == "queued"
    assert queued.json()["artifact_dir"] == first["artifact_dir"]  # the current one serves on
    status = _finished_retrain(client, "medusa")
    record = status["retrains"][-1]
    current, candidate = record["current"], record["candidate"]
    assert record["samples"] == 40 and record["heldout"] == 10  # the 25 % most recent
    assert current["prompts"] == candidate["prompts"] == 10  # scored on the same requests
    gain = candidate["tau"] - current["tau"]
    key = registry.get("bot").key
    new_dir = drafter_dir(settings, key, "medusa", 2)
    if record["state"] == "replaced":
        assert gain > 0 and "beats" in record["reason"], record
        assert status["revision"] == 2 and status["artifact_dir"] == str(new_dir)
        assert status["tau"] == candidate["tau"] and new_dir.is_dir()
        served = client.post(
            "/v1/completions",
            json={"model": "bot", "prompt": "w3 w4", "max_tokens": 8, "speculation": "medusa"},
        )
        assert served.json()["specserve"]["strategy"] == "medusa"
    else:
        assert record["state"] == "kept" and gain <= 0 and "does not beat" in record["reason"]
        assert status["revision"] == 1 and status["artifact_dir"] == first["artifact_dir"]
        assert not new_dir.exists()  # a refused candidate is not kept

    # a candidate that must gain more than it can is refused, with the reason; nothing changes
    body |= {"min_gain": 100.0}
    before = client.get("/admin/variants/bot/drafters", headers=ADMIN).json()["medusa"]
    client.post("/admin/variants/bot/drafters", headers=ADMIN, json=body)
    refused = _finished_retrain(client, "medusa", record["started_at"])
    last = refused["retrains"][-1]
    assert (
        last["state"] == "kept" and "does not beat" in last["reason"] and "100.00" in last["reason"]
    )
    assert refused["artifact_dir"] == before["artifact_dir"]
    assert refused["revision"] == before["revision"] and len(refused["retrains"]) == 2
    assert not any((cache / "traffic-scratch").glob("*"))  # the traffic's teacher data is gone

    assert client.delete("/admin/variants/bot", headers=ADMIN).status_code == 200
    assert MARK not in _strings_in_redis(store)
    on_disk = [p for p in Path(cache).rglob("*") if p.is_file() and MARK.encode() in p.read_bytes()]
    assert on_disk == []
    # a capture still queued in a gateway when the variant went is refused by the store
    late = TrafficSample(
        prompt=f"{MARK} late", output="w3", version=1, strategy="ar", at=time.time()
    )
    written = gateway.traffic.written
    gateway.traffic.record("bot", late)
    gateway.traffic.flush()
    assert gateway.traffic.written == written and MARK not in _strings_in_redis(store)


def test_capture_is_off_by_default_and_a_retrain_needs_traffic(platform):
    client, gateway, registry, _, _, _ = platform
    assert client.get("/admin/variants/bot", headers=ADMIN).json()["capture"]["enabled"] is False
    _serve(client, 3)
    gateway.flush_traffic()
    assert TrafficLog(registry).samples("bot") == []  # nothing kept unless the admin asks
    body = {"kind": "medusa", "from_traffic": True}
    refused = client.post("/admin/variants/bot/drafters", headers=ADMIN, json=body)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_traffic"
    bad = client.put("/admin/variants/bot/capture", headers=ADMIN, json={"max_samples": 0})
    assert bad.status_code == 400
    client.put("/admin/variants/bot/capture", headers=ADMIN, json={"enabled": True})
    _serve(client, 3)
    gateway.flush_traffic()
    assert len(TrafficLog(registry).samples("bot")) == 3
    assert client.delete("/admin/variants/bot/traffic", headers=ADMIN).json() == {"erased": 3}
    client.put("/admin/variants/bot/capture", headers=ADMIN, json={"enabled": False})
    _serve(client, 2)
    gateway.flush_traffic()
    assert TrafficLog(registry).samples("bot") == []
