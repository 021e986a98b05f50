"""Drafter training through the admin API: a real job (tiny model, seconds), its status in the
registry, and its artifact keyed to the variant's version."""

from __future__ import annotations

import shutil
import time

import pytest
import transformers
from fastapi.testclient import TestClient

from specserve.adapters.fingerprint import adapter_sha256
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.engine.drafters.artifact import read_manifest
from specserve.platform.api.admin import Admin, admin_router
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.rayserve.job_dirs import drafter_dir
from specserve.platform.rayserve.jobs import ThreadJobs
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

ADMIN = {"Authorization": "Bearer t"}


@pytest.mark.timeout(300)
def test_train_follow_and_artifact_keyed_to_the_version(
    tmp_path, save_tiny_model_dir, make_adapter, redis_server, redis_store, monkeypatch
):
    model_dir = save_tiny_model_dir(tmp_path / "model")
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    root = tmp_path / "root"
    root.mkdir()
    adapter = root / "v1"
    shutil.copytree(make_adapter("v1", base, seed=1, base_name="tiny"), adapter)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    args = {"models": ["tiny"], "model_dirs": {"tiny": str(model_dir)}, "adapter_root": str(root)}
    args["dtype"] = "float32"  # the exact mode: outputs compared token for token
    settings = PlatformSettings.from_args(
        args | {"max_tokens": 64}, env={"SPECSERVE_CACHE": str(tmp_path / "cache")}
    )
    args["adapter_root"] = str(root)
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    registry = Registry(redis_store)
    jobs = ThreadJobs(args)
    admin = Admin(
        registry,
        "t",
        {"tiny": BaseModelSpec.of(base, ["tiny"])},
        AdapterLimits(root=root),
        PolicySettings(),
        jobs,
    )
    gateway = Gateway(settings, registry, LocalBackend({}), Metrics())
    client = TestClient(create_app(gateway, admin_router(admin)))
    assert (
        client.post(
            "/admin/variants",
            headers=ADMIN,
            json={"name": "bot", "base_model": "tiny", "adapter_path": str(adapter)},
        ).status_code
        == 201
    )

    started = client.post(
        "/admin/variants/bot/drafters",
        headers=ADMIN,
        json={"kind": "medusa", "budget_minutes": 0.05},
    )
    assert started.status_code == 202 and started.json()["state"] in ("queued", "running")
    again = client.post("/admin/variants/bot/drafters", headers=ADMIN, json={"kind": "medusa"})
    assert again.status_code == 409  # one training per version and kind at a time
    deadline = time.time() + 240
    while time.time() < deadline:
        status = client.get("/admin/variants/bot/drafters", headers=ADMIN).json()["medusa"]
        if status["state"] not in ("queued", "running"):
            break
        time.sleep(0.5)
    assert status["state"] == "succeeded", status
    key = registry.get("bot").key
    assert status["artifact_dir"] == str(drafter_dir(settings, key, "medusa"))
    manifest = read_manifest(status["artifact_dir"])
    assert (
        manifest.adapter_sha256 == adapter_sha256(adapter) and status["tau"] == manifest.heldout_tau
    )
    shown = client.get("/admin/variants/bot", headers=ADMIN).json()
    assert shown["drafters"]["medusa"]["state"] == "succeeded"
    assert (
        client.post(
            "/admin/variants/bot/drafters", headers=ADMIN, json={"kind": "warp"}
        ).status_code
        == 400
    )


def test_training_without_a_runner_is_503(tmp_path, tiny_llama, make_adapter, adapter_root):
    from specserve.platform.state.memory_store import MemoryStore

    base = tiny_llama(0)
    registry = Registry(MemoryStore())
    admin = Admin(
        registry,
        "t",
        {"tiny-llama": BaseModelSpec.of(base, ["tiny-llama"])},
        AdapterLimits(root=adapter_root),
        PolicySettings(),
    )
    gateway = Gateway(
        PlatformSettings(models=["tiny-llama"]), registry, LocalBackend({}), Metrics()
    )
    client = TestClient(create_app(gateway, admin_router(admin)))
    path = make_adapter("x", base)
    client.post(
        "/admin/variants",
        headers=ADMIN,
        json={"name": "x", "base_model": "tiny-llama", "adapter_path": str(path)},
    )
    r = client.post("/admin/variants/x/drafters", headers=ADMIN, json={"kind": "eagle"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_trainer"
    assert client.delete("/admin/variants/x/drafters/eagle", headers=ADMIN).status_code == 409


@pytest.mark.timeout(300)
def test_policy_queues_training_once_for_a_stable_variant(
    tmp_path, save_tiny_model_dir, make_adapter, redis_server, redis_store, monkeypatch
):
    """A stable variant without a drafter is served with lookahead and the policy's request for
    a drafter starts exactly one training job for that version."""
    from specserve.adapters.resident import ResidentAdapters
    from specserve.adapters.variants import PoolBook
    from specserve.models.load import load_model
    from specserve.platform.service import ModelService

    model_dir = save_tiny_model_dir(tmp_path / "model")
    loaded = load_model(str(model_dir))
    loaded.model_id = "tiny"
    root = tmp_path / "root"
    root.mkdir()
    adapter = root / "v1"
    shutil.copytree(make_adapter("v1", loaded.model, seed=1, base_name="tiny"), adapter)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    args = {"models": ["tiny"], "model_dirs": {"tiny": str(model_dir)}, "adapter_root": str(root)}
    args["dtype"] = "float32"  # the exact mode: outputs compared token for token
    settings = PlatformSettings.from_args(args)
    registry = Registry(redis_store, clock=lambda: time.time() - 7200)  # registered two hours ago
    base_spec = BaseModelSpec.of(loaded.model, ["tiny"])
    jobs = StartLog()  # the wiring under test; real training is test_train_follow_and_artifact...
    policy = PolicySettings(train_kind="medusa")  # the quicker kind to train in a test
    admin = Admin(registry, "t", {"tiny": base_spec}, AdapterLimits(root=root), policy, jobs)
    adapters = ResidentAdapters(loaded.model, ["tiny"], AdapterLimits(root=root))
    service = ModelService(loaded, adapters, PoolBook(), policy)
    gateway = Gateway(
        settings, registry, LocalBackend({"tiny": service}), Metrics(), on_train=admin.auto_train
    )
    client = TestClient(create_app(gateway, admin_router(admin)))
    assert (
        client.post(
            "/admin/variants",
            headers=ADMIN,
            json={"name": "calm", "base_model": "tiny", "adapter_path": str(adapter)},
        ).status_code
        == 201
    )
    body = {
        "model": "calm",
        "messages": [{"role": "user", "content": "w3 w4 w5"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    first = client.post("/v1/chat/completions", json=body).json()["specserve"]
    assert first["strategy"] == "lookahead" and "queueing medusa training" in first["reason"]
    time.sleep(1.0)
    second = client.post("/v1/chat/completions", json=body).json()["specserve"]
    assert (
        second["strategy"] == "lookahead"
        and "medusa drafter training in progress" in second["reason"]
    )
    assert jobs.started == [("calm@1", "medusa")]  # asked twice, queued once
    status = client.get("/admin/variants/calm/drafters", headers=ADMIN).json()["medusa"]
    assert status["state"] == "queued"


class StartLog:
    """A jobs runner that records what it was asked to start (the real ones are tested above)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    def start(self, record, kind, budget_minutes) -> None:
        self.started.append((str(record.key), kind))

    def cancel(self, key, kind) -> None:
        pass
