"""The gateway and admin API with the registry store down (a real redis-server, stopped): every
route answers JSON, nothing 5xx but 503 registry_unavailable with Retry-After, no traceback;
/v1/models serves its cached variants marked stale. And variant names may not shadow models."""

from __future__ import annotations

import copy
import re

import pytest
from fastapi.testclient import TestClient
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.adapters.variants import PoolBook
from specserve.models.load import LoadedModel
from specserve.platform.api.admin import Admin, admin_router
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.service import ModelService
from specserve.platform.settings import PlatformSettings, TenantKeys
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.records import VariantSpec
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

BASE = "tiny-llama"
ALIAS = "TinyOrg/Tiny-Llama-Instruct"  # a name the base model also answers to
ADMIN = {"Authorization": "Bearer admin-secret"}
PROMPT = "w5 w9 w14 w3 w5 w9"
NON_JSON = {"/metrics", "/docs", "/docs/oauth2-redirect", "/redoc"}  # text by design
TRACEBACK = re.compile(r"Traceback|File \"|\.py\b|Error\(|line \d+")


@pytest.fixture
def app(tiny_llama, adapter_root):
    """Factory: app(store) -> (TestClient that answers server errors, gateway, registry)."""

    def make(store):
        base = tiny_llama(1, init_range=0.1)
        loaded = LoadedModel(copy.deepcopy(base), WordTokenizer(), BASE, None, None, frozenset())
        limits = AdapterLimits(root=adapter_root)
        adapters = ResidentAdapters(loaded.model, [BASE], limits)
        service = ModelService(loaded, adapters, PoolBook(), PolicySettings())
        settings = PlatformSettings(models=[BASE], max_tokens=64, tenant_keys=TenantKeys())
        registry = Registry(store)
        gateway = Gateway(settings, registry, LocalBackend({BASE: service}), Metrics())
        specs = {BASE: BaseModelSpec.of(base, [BASE, ALIAS])}
        admin = Admin(registry, "admin-secret", specs, limits, PolicySettings())
        client = TestClient(create_app(gateway, admin_router(admin)), raise_server_exceptions=False)
        return client, gateway, registry

    return make


def _register(client, name, path):
    body = {"name": name, "base_model": BASE, "adapter_path": str(path)}
    return client.post("/admin/variants", headers=ADMIN, json=body)


def _bodies(adapter: str) -> dict[tuple[str, str], dict]:
    """A minimal valid body per (method, route) that takes one."""
    return {
        ("POST", "/v1/completions"): {"model": BASE, "prompt": PROMPT, "max_tokens": 4},
        ("POST", "/v1/chat/completions"): {
            "model": "kept",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 4,
        },
        ("POST", "/admin/variants"): {"name": "fresh", "base_model": BASE, "adapter_path": adapter},
        ("PUT", "/admin/variants/{name}/strategy"): {"strategy": "prompt_lookup"},
        ("POST", "/admin/variants/{name}/drafters"): {"kind": "eagle"},
        ("PUT", "/admin/policy"): {"busy_ongoing": 2},
        ("PUT", "/admin/variants/{name}/capture"): {"enabled": True},
    }


def _operations(app) -> dict[tuple[str, str], dict]:
    """(method, route path) -> its OpenAPI operation ({} for a route outside the schema) of every
    route: the schema's operations (the included routers) and the app's own (schema, docs)."""
    found = {
        (method.upper(), path): operation
        for path, operations in app.openapi()["paths"].items()
        for method, operation in operations.items()
    }
    for route in app.routes:
        for method in getattr(route, "methods", None) or ():
            found.setdefault((method, route.path), {})
    return {op: found[op] for op in found if op[0] != "HEAD"}


def _calls(app, adapter: str):
    """(method, route path, concrete path, body, operation) for every route and method of `app`."""
    bodies = _bodies(adapter)
    for (method, route), operation in sorted(_operations(app).items()):
        if "requestBody" in operation and (method, route) not in bodies:
            pytest.fail(f"no body for {method} {route}; have: {sorted(bodies)}")
        path = route.replace("{name}", "kept").replace("{kind}", "eagle")
        yield method, route, path, bodies.get((method, route)), operation


def _check(method, route, response, operation) -> list[str]:
    """What is wrong with one response of a store-down walk ([] if nothing)."""
    where = f"{method} {route} -> {response.status_code}"
    kind = response.headers.get("content-type", "")
    if route in NON_JSON and response.status_code < 400:
        return [] if kind.startswith(("text/", "application/json")) else [f"{where}: {kind}"]
    if not kind.startswith("application/json"):
        return [f"{where}: not JSON ({kind}): {response.text[:200]}"]
    problems = [f"{where}: traceback text"] if TRACEBACK.search(response.text) else []
    if response.status_code >= 400:
        error = response.json().get("error") or {}
        if set(error) != {"message", "type", "param", "code", "request_id"}:
            problems.append(f"{where}: not an OpenAI error: {response.text[:200]}")
    if response.status_code >= 500:
        documented = (
            response.status_code == 503
            and response.json()["error"]["code"] == "registry_unavailable"
            and response.headers.get("retry-after", "").isdigit()
            and "503" in operation.get("responses", {})
        )
        if not documented:
            problems.append(f"{where}: {response.text[:200]}")
    if route.startswith("/admin") and response.status_code != 503:
        problems.append(f"{where}: the admin API must answer 503 while the store is down")
    return problems


def test_every_route_answers_json_and_no_5xx_but_registry_unavailable_with_the_store_down(
    app, redis_server, redis_store, tiny_llama, make_adapter
):
    client, _, _ = app(redis_store)
    base = tiny_llama(1, init_range=0.1)
    assert _register(client, "kept", make_adapter("kept", base)).status_code == 201
    fresh = str(make_adapter("fresh", base, seed=2))
    redis_server.stop()
    problems, seen = [], set()
    for method, route, path, body, operation in _calls(client.app, fresh):
        response = client.request(method, path, headers=ADMIN, json=body)
        seen.add((method, route))
        problems += _check(method, route, response, operation)
    assert problems == []
    assert {("GET", "/admin/variants"), ("POST", "/admin/variants"), ("GET", "/v1/models")} <= seen


def test_v1_models_serves_cached_variants_marked_stale_while_the_store_is_down(
    app, redis_server, redis_store, tiny_llama, make_adapter
):
    client, gateway, _ = app(redis_store)
    assert _register(client, "kept", make_adapter("kept", tiny_llama(1, init_range=0.1))).is_success
    fresh = client.get("/v1/models")
    assert "x-specserve-stale" not in fresh.headers and fresh.json()["specserve"]["stale"] is False
    redis_server.stop()
    for _ in range(2):  # the failing read, then the open breaker
        down = client.get("/v1/models")
        assert down.status_code == 200 and down.headers["x-specserve-stale"] == "true"
        assert [m["id"] for m in down.json()["data"]] == [BASE, "kept"]
        assert down.json()["specserve"]["stale"] is True
    redis_server.start()
    gateway.breaker.reset()
    again = client.get("/v1/models")
    assert "x-specserve-stale" not in again.headers and again.json()["specserve"]["stale"] is False


def test_v1_models_never_read_lists_base_models_marked_stale(app, redis_server, redis_store):
    client, _, _ = app(redis_store)
    redis_server.stop()
    down = client.get("/v1/models")
    assert down.status_code == 200 and down.headers["x-specserve-stale"] == "true"
    assert [m["id"] for m in down.json()["data"]] == [BASE]


def test_an_unexpected_exception_answers_a_short_openai_500(app, monkeypatch):
    client, gateway, _ = app(MemoryStore())

    def broken():
        raise RuntimeError("secret detail at /srv/specserve/x.py line 3")

    monkeypatch.setattr(gateway, "health", broken)
    r = client.get("/healthz")
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "internal_error" and "secret" not in r.text


def test_unknown_routes_and_methods_answer_openai_errors(app):
    client, _, _ = app(MemoryStore())
    missing = client.get("/v1/nope")
    assert missing.status_code == 404 and missing.json()["error"]["message"].endswith(
        "(GET /v1/nope)"
    )
    wrong = client.delete("/v1/models")
    assert wrong.status_code == 405 and set(wrong.json()["error"]) >= {"message", "code"}


@pytest.mark.parametrize("name", [BASE, "Tiny-Llama", ALIAS])
def test_a_variant_may_not_take_a_served_model_name(app, tiny_llama, make_adapter, name):
    client, _, registry = app(MemoryStore())
    r = _register(client, name, make_adapter("shadow", tiny_llama(1, init_range=0.1)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("name", "reserved_name") and BASE in error["message"]
    assert registry.names() == []


def test_v1_models_lists_every_id_once(app):
    """A variant named like a base model that reached the registry anyway is not listed."""
    client, _, registry = app(MemoryStore())
    for name in (BASE, "other"):
        registry.register(
            VariantSpec(name=name, base_model=BASE, adapter_path="/x", adapter_sha256="0" * 64)
        )
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert ids == [BASE, "other"]
