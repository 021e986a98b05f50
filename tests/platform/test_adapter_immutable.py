"""Immutable adapters end to end (admin API, gateway, in-process service, tiny model): a version
serves the bytes validated at registration whatever happens to its source later, and a copy whose
bytes no longer match the registered sha256 is refused with an OpenAI error, never served."""

from __future__ import annotations

import copy

import pytest
from fastapi.testclient import TestClient
from word_tokenizer import WordTokenizer

from specserve.adapters.content import STORE_DIR
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
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

BASE = "tiny-llama"
ADMIN = {"Authorization": "Bearer t"}
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9"
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def base(tiny_llama):
    return tiny_llama(1, init_range=0.1)


@pytest.fixture
def served(base, adapter_root):
    """(client, service): the gateway and admin API over one in-process model service."""
    model = copy.deepcopy(base)
    limits = AdapterLimits(root=adapter_root)
    adapters = ResidentAdapters(model, [BASE], limits)
    loaded = LoadedModel(model, WordTokenizer(), BASE, None, None, frozenset())
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings())
    registry = Registry(MemoryStore())
    settings = PlatformSettings(models=[BASE], max_tokens=64)
    gateway = Gateway(settings, registry, LocalBackend({BASE: service}), Metrics())
    specs = {BASE: BaseModelSpec.of(base, [BASE])}
    admin = Admin(registry, "t", specs, limits, PolicySettings())
    return TestClient(create_app(gateway, admin_router(admin))), service


def _register(client, name, path) -> dict:
    body = {"name": name, "base_model": BASE, "adapter_path": str(path)}
    r = client.post("/admin/variants", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _chat(client, model, stream=False):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
    }
    return client.post("/v1/chat/completions", json=body)


def _expected(model) -> str:
    ids = [int(w[1:]) for w in PROMPT.split()]
    engine = Engine(model, WordTokenizer(), frozenset())
    return engine.generate(ids, SamplingParams(max_new_tokens=12)).text


def _rewrite_in_place(path, donor) -> None:
    """Overwrite `path`'s weights with `donor`'s (same shapes, other values), same inode."""
    data = (donor / WEIGHTS).read_bytes()
    assert len(data) == (path / WEIGHTS).stat().st_size
    (path / WEIGHTS).chmod(0o644)
    with open(path / WEIGHTS, "r+b") as f:
        f.write(data)


def test_a_rewritten_source_cannot_alter_the_registered_version(
    served, base, make_adapter, merge_adapter
):
    client, _ = served
    source = make_adapter("src", base, seed=1)
    want = _expected(merge_adapter(base, source))
    record = _register(client, "bot", source)
    assert record["adapter_path"] == str(
        source.parent.resolve() / STORE_DIR / record["adapter_sha256"]
    )
    _rewrite_in_place(source, make_adapter("donor", base, seed=2))
    assert _expected(merge_adapter(base, source)) != want  # the rewrite would change outputs
    r = _chat(client, "bot")  # the first load of the adapter: after the rewrite
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want


@pytest.mark.parametrize("stream", [False, True])
def test_a_corrupted_copy_is_refused_with_the_digest_error_and_never_served(
    served, base, make_adapter, stream
):
    client, service = served
    record = _register(client, "bot", make_adapter("src", base, seed=1))
    frozen = service.adapters.limits.root.resolve() / STORE_DIR / record["adapter_sha256"]
    assert record["adapter_path"] == str(frozen)
    _rewrite_in_place(frozen, make_adapter("donor", base, seed=2))
    r = _chat(client, "bot", stream=stream)
    error = r.json()["error"]
    assert error["code"] == "adapter_digest_mismatch" and error["type"] == "server_error"
    assert r.status_code >= 500 and "choices" not in r.json()  # a server-side fault, no output
    assert "bot@1" not in service.adapters and service.adapters.store.names == []
    assert service.adapters.stats.refusals == {"adapter_digest_mismatch": 1}
    assert service.scheduler.steps == 0  # nothing decoded
    # reported broken: refused at the gateway from now on (no second load or hash), shown by admin
    again = _chat(client, "bot", stream=stream)
    assert again.status_code == 500 and again.json()["error"]["code"] == "adapter_digest_mismatch"
    assert "bot@1 is broken" in again.json()["error"]["message"]
    assert service.adapters.stats.refusals == {"adapter_digest_mismatch": 1}
    shown = client.get("/admin/variants/bot", headers=ADMIN).json()
    assert "sha256 mismatch" in shown["versions"][0]["broken"]


def test_a_new_version_of_a_broken_variant_serves(served, base, make_adapter, merge_adapter):
    client, service = served
    record = _register(client, "bot", make_adapter("src", base, seed=1))
    frozen = service.adapters.limits.root.resolve() / STORE_DIR / record["adapter_sha256"]
    _rewrite_in_place(frozen, make_adapter("donor", base, seed=2))
    assert _chat(client, "bot").status_code == 500
    fresh = make_adapter("fresh", base, seed=3)
    assert _register(client, "bot", fresh)["version"] == 2
    r = _chat(client, "bot")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == _expected(merge_adapter(base, fresh))
    shown = client.get("/admin/variants/bot", headers=ADMIN).json()
    assert [v["broken"] is None for v in shown["versions"]] == [False, True]


def test_registering_the_same_bytes_twice_shares_one_copy(served, base, make_adapter, tmp_path):
    client, _ = served
    first = _register(client, "a", make_adapter("a", base, seed=1))
    second = _register(client, "b", make_adapter("b", base, seed=1))
    assert first["adapter_path"] == second["adapter_path"]
    store = make_adapter("c", base, seed=3).parent / STORE_DIR
    assert [p.name for p in store.iterdir()] == [first["adapter_sha256"]]
