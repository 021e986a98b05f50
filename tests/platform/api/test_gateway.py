"""The gateway over HTTP (in-process model service, real registry on a real store): OpenAI shapes,
exact variant output, streaming, versions without restart, admin auth, tenants, errors, overload."""

from __future__ import annotations

import copy
import json

import pytest
from fastapi.testclient import TestClient
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.adapters.variants import PoolBook
from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams
from specserve.models.load import LoadedModel
from specserve.platform.api.admin import Admin, admin_router
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.service import ModelService
from specserve.platform.settings import PlatformSettings, TenantKeys
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

BASE = "tiny-llama"
TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9"


def _base(tiny_llama):
    return tiny_llama(1, init_range=0.1)


@pytest.fixture
def platform(tiny_llama, adapter_root):
    """(client, gateway, registry) with settings overridable through `make(**settings)`."""

    def make(store=None, tenants=None, **overrides):
        base = copy.deepcopy(_base(tiny_llama))
        loaded = LoadedModel(base, WordTokenizer(), BASE, None, None, frozenset())
        limits = AdapterLimits(root=adapter_root)
        adapters = ResidentAdapters(base, [BASE], limits)
        service = ModelService(loaded, adapters, PoolBook(), PolicySettings())
        values = {"models": [BASE], "max_tokens": 64, "max_body_bytes": 4096} | overrides
        settings = PlatformSettings(**values, tenant_keys=TenantKeys(variants_by_key=tenants or {}))
        registry = Registry(store or MemoryStore())
        gateway = Gateway(settings, registry, LocalBackend({BASE: service}), Metrics())
        admin = Admin(
            registry,
            TOKEN,
            {BASE: BaseModelSpec.of(_base(tiny_llama), [BASE])},
            limits,
            PolicySettings(),
        )
        return TestClient(create_app(gateway, admin_router(admin))), gateway, registry

    return make


def _register(client, name, path):
    r = client.post(
        "/admin/variants",
        headers=ADMIN,
        json={"name": name, "base_model": BASE, "adapter_path": str(path)},
    )
    assert r.status_code == 201, r.text
    return r.json()


def _chat(client, model, stream=False, max_tokens=16, headers=None, **extra):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    } | extra
    return client.post("/v1/chat/completions", json=body, headers=headers or {})


def _sse(response) -> list[dict]:
    lines = [ln for ln in response.text.split("\n\n") if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln[6:]) for ln in lines[:-1]]


def _expected(model, max_new=16) -> str:
    ids = [int(w[1:]) for w in PROMPT.split()]
    return (
        Engine(model, WordTokenizer(), frozenset())
        .generate(ids, SamplingParams(max_new_tokens=max_new))
        .text
    )


def test_variant_chat_is_exact_streams_the_same_and_new_versions_apply_without_restart(
    platform, tiny_llama, make_adapter, merge_adapter
):
    client, _, _ = platform()
    v1, v2 = (
        make_adapter("v1", _base(tiny_llama), seed=1),
        make_adapter("v2", _base(tiny_llama), seed=2),
    )
    assert _register(client, "support", v1)["version"] == 1
    assert "support" in [m["id"] for m in client.get("/v1/models").json()["data"]]

    r = _chat(client, "support")
    assert r.status_code == 200, r.text
    body = r.json()
    want = _expected(merge_adapter(_base(tiny_llama), v1))
    assert body["choices"][0]["message"]["content"] == want
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 16
    assert body["specserve"]["variant"] == "support" and body["specserve"]["version"] == 1
    assert (
        body["specserve"]["strategy"] == "lookahead" and "changing" in body["specserve"]["reason"]
    )

    chunks = _sse(_chat(client, "support", stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == want
    assert (
        chunks[-1]["choices"][0]["finish_reason"] == "length"
        and chunks[-1]["specserve"]["version"] == 1
    )

    assert _register(client, "support", v2)["version"] == 2
    again = _chat(client, "support").json()
    assert again["specserve"]["version"] == 2
    assert (
        again["choices"][0]["message"]["content"]
        == _expected(merge_adapter(_base(tiny_llama), v2))
        != want
    )
    pinned = _chat(client, "support@1").json()  # an older version stays addressable
    assert pinned["choices"][0]["message"]["content"] == want


def test_base_completion_and_stream_with_usage(platform, tiny_llama):
    client, _, _ = platform()
    body = {"model": BASE, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text == _expected(_base(tiny_llama), 12) and r.json()["object"] == "text_completion"
    chunks = _sse(
        client.post(
            "/v1/completions",
            json=body | {"stream": True, "stream_options": {"include_usage": True}},
        )
    )
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == text
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        ({"model": "nope", "prompt": "w1"}, 404, "model", "model_not_found"),
        (
            {"model": BASE, "prompt": "w1", "max_tokens": 65},
            400,
            "max_tokens",
            "max_tokens_too_large",
        ),
        ({"model": BASE, "prompt": "w1", "n": 0}, 400, "n", "invalid_value"),
        ({"model": BASE, "prompt": "w1", "frobnicate": 1}, 400, "frobnicate", "unknown_field"),
        (
            {"model": BASE, "prompt": "w1", "temperature": 3},
            400,
            "temperature",
            "invalid_value",
        ),
        ({"model": BASE, "prompt": "w1 " * 1400, "max_tokens": 10}, 413, None, "body_too_large"),
        (
            {"model": BASE, "prompt": "w1 " * 1010, "max_tokens": 20},
            400,
            "prompt",
            "invalid_prompt",
        ),
    ],
)
def test_errors_are_openai_shaped(platform, body, status, param, code):
    client, _, _ = platform(max_body_bytes=4000)
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code", "request_id"}
    assert (error["param"], error["code"]) == (param, code)


def test_malformed_json_is_400(platform):
    client, _, _ = platform()
    r = client.post(
        "/v1/chat/completions",
        content=b'{"model": "tiny", "messages": [',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_admin_needs_the_token(platform, tiny_llama, make_adapter):
    client, _, _ = platform()
    body = {
        "name": "x",
        "base_model": BASE,
        "adapter_path": str(make_adapter("x", _base(tiny_llama))),
    }
    assert client.post("/admin/variants", json=body).status_code == 401
    assert (
        client.post(
            "/admin/variants", json=body, headers={"Authorization": "Bearer wrong"}
        ).status_code
        == 403
    )
    assert (
        client.get("/admin/variants", headers={"Authorization": "Bearer wrong"}).status_code == 403
    )
    assert client.post("/admin/variants", json=body, headers=ADMIN).status_code == 201


def test_admin_refuses_bad_adapters_with_their_code(platform, tiny_llama, make_adapter, tmp_path):
    client, _, registry = platform()
    path = make_adapter("bad", _base(tiny_llama))
    (path / "adapter_model.bin").write_bytes(b"\x80\x04.")
    r = client.post(
        "/admin/variants",
        headers=ADMIN,
        json={"name": "bad", "base_model": BASE, "adapter_path": str(path)},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "adapter_pickle_format"
    outside = client.post(
        "/admin/variants",
        headers=ADMIN,
        json={"name": "o", "base_model": BASE, "adapter_path": str(tmp_path)},
    )
    assert outside.json()["error"]["code"] == "adapter_path_outside_root"
    assert registry.names() == []


def test_admin_show_strategy_override_policy_and_delete(platform, tiny_llama, make_adapter):
    client, _, _ = platform()
    _register(client, "s", make_adapter("s", _base(tiny_llama)))
    shown = client.get("/admin/variants/s", headers=ADMIN).json()
    assert (
        shown["strategy"] == "lookahead"
        and "changing" in shown["reason"]
        and shown["current_version"] == 1
    )
    forced = client.put(
        "/admin/variants/s/strategy", headers=ADMIN, json={"strategy": "prompt_lookup"}
    ).json()
    assert (
        forced["strategy"] == "prompt_lookup"
        and forced["reason"] == "forced by admin to prompt_lookup"
    )
    assert _chat(client, "s").json()["specserve"]["strategy"] == "prompt_lookup"
    bad = client.put("/admin/variants/s/strategy", headers=ADMIN, json={"strategy": "warp"})
    assert bad.status_code == 400 and "valid strategies" in bad.json()["error"]["message"]
    policy = client.put(
        "/admin/policy", headers=ADMIN, json={"busy_ongoing": 2, "saturated_ongoing": 3}
    ).json()
    assert (
        policy["busy_ongoing"] == 2
        and client.get("/admin/policy", headers=ADMIN).json()["saturated_ongoing"] == 3
    )
    assert client.put("/admin/policy", headers=ADMIN, json={"nonsense": 1}).status_code == 400
    assert client.delete("/admin/variants/s", headers=ADMIN).status_code == 200
    assert _chat(client, "s").status_code == 404
    assert client.get("/admin/variants/s", headers=ADMIN).status_code == 404


def test_tenant_keys_hide_other_tenants_variants(platform, tiny_llama, make_adapter):
    client, _, _ = platform(tenants={"key-a": frozenset({"alpha"}), "key-b": frozenset({"beta"})})
    _register(client, "alpha", make_adapter("alpha", _base(tiny_llama), seed=1))
    _register(client, "beta", make_adapter("beta", _base(tiny_llama), seed=2))
    a = {"Authorization": "Bearer key-a"}
    assert _chat(client, "alpha", headers=a).status_code == 200
    r = _chat(client, "beta", headers=a)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert _chat(client, "alpha").status_code == 404  # no key: tenant variants are hidden
    assert _chat(client, BASE, headers=a).status_code == 200  # base models are public
    assert _chat(client, BASE, headers={"Authorization": "Bearer forged"}).status_code == 401
    ids = [m["id"] for m in client.get("/v1/models", headers=a).json()["data"]]
    assert ids == [BASE, "alpha"]


def test_overload_answers_503_with_retry_after(platform):
    client, gateway, _ = platform(max_inflight_per_model=1)
    gateway.inflight[BASE] = 1  # one request holds the only slot
    r = _chat(client, BASE)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "overloaded"
    gateway.inflight[BASE] = 0
    assert _chat(client, BASE).status_code == 200 and gateway.inflight[BASE] == 0


def test_healthz_degrades_with_the_store_and_recovers(platform, redis_server, redis_store):
    client, gateway, _ = platform(store=redis_store)
    assert client.get("/healthz").json()["status"] == "ok"
    redis_server.stop()
    gateway._store_ok = (0.0, True, "")  # skip the 2 s cache
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "degraded"
    assert r.json()["store"] == "unreachable" and str(redis_server.port) not in r.text  # no address
    assert _chat(client, BASE).status_code == 200  # base traffic keeps flowing
    redis_server.start()
    gateway._store_ok = (0.0, False, "")
    assert client.get("/healthz").json()["status"] == "ok"


def test_healthz_says_how_each_model_is_served(platform):
    """dtype and invariant: true|false (with the probe's reason) per base model, from replica
    stats; the fp32 tiny model here is not on the invariant forward (MKL is not row-invariant)."""
    client, _, _ = platform()
    serving = client.get("/healthz").json()["serving"]
    assert serving[BASE]["dtype"] == "torch.float32"
    assert isinstance(serving[BASE]["invariant"], bool) and serving[BASE]["invariant_reason"]


def test_metrics_expose_request_figures(platform):
    client, _, _ = platform()
    _chat(client, BASE)
    _chat(client, "nope")
    text = client.get("/metrics").text
    assert (
        'specserve_requests_total{base_model="tiny-llama",endpoint="chat",strategy="lookahead",variant="base"} 1.0'
        in text
    )
    assert "specserve_ttft_seconds_count" in text and 'code="model_not_found"' in text
    assert 'specserve_adapter_loads{base_model="tiny-llama",replica="tiny-llama/local"} 0.0' in text


def test_openapi_fuzz_never_5xx(platform):
    """A bounded schemathesis run over the app's own OpenAPI schema."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    client, _, _ = platform()
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    failures = []
    for op in schema.get_all_operations():
        operation = op.ok()
        if operation.path.startswith("/admin"):
            continue

        @settings(
            max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call()
            if response.status_code >= 500:
                failures.append((case.path, response.status_code, response.text[:200]))

        check()
    assert failures == []


def test_variants_keep_serving_from_cache_while_the_store_is_down(
    platform, redis_server, redis_store, tiny_llama, make_adapter
):
    client, gateway, registry = platform(store=redis_store)
    _register(client, "kept", make_adapter("kept", _base(tiny_llama), seed=1))
    _register(client, "unseen", make_adapter("unseen", _base(tiny_llama), seed=2))
    first = _chat(client, "kept").json()
    redis_server.stop()
    again = _chat(client, "kept")
    assert again.status_code == 200 and again.json()["choices"] == first["choices"]
    cold = _chat(client, "unseen")
    assert cold.status_code == 503 and cold.headers["retry-after"] == "2"
    gateway.flush_acceptance()  # figures stay queued while the store is down
    redis_server.start()
    gateway.breaker.reset()
    gateway.flush_acceptance()
    from specserve.adapters.variants import VariantKey

    figures = registry.acceptance(VariantKey("kept", 1))["lookahead"]  # this Redis restarted empty
    assert figures.tokens == 32 and figures.forwards > 0
