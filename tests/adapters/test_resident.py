"""Adapters on a shared base: exact against merged weights, mixed batches, LRU within a byte
budget, loads prepared off the engine thread, refusals."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specserve.adapters import errors
from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.engine.decode.engine import Engine
from specserve.engine.lora.batch import BASE_ADAPTER, lora_rows
from specserve.engine.sampling import SamplingParams

BASE = "tiny-llama"
STRATEGIES = {  # name -> (strategy, config): every built-in strategy, chains and trees
    "ar": ("ar", None),
    "prompt_lookup": ("prompt_lookup", {"min_ngram": 1, "draft_len": 4, "max_matches": 3}),
    "lookahead": ("lookahead", {"window": 3, "ngram": 3, "guesses": 3}),
    "lookahead-wide": ("lookahead", {"window": 5, "ngram": 4, "guesses": 5}),
}
PROMPT = [5, 9, 14, 3, 5, 9, 14, 7, 5, 9, 14, 3, 22, 5, 9]


@pytest.fixture
def base(tiny_llama):
    return copy.deepcopy(tiny_llama(1, init_range=0.1))  # wrapping injects layers: use a copy


@pytest.fixture
def limits(adapter_root):
    return AdapterLimits(root=adapter_root, max_resident=3)


@pytest.fixture
def resident(base, limits):
    return ResidentAdapters(base, [BASE], limits)


def _generate(model, tokenizer, strategy, config, adapter=None, max_new=30):
    engine = Engine(model, tokenizer, frozenset())
    params = SamplingParams(max_new_tokens=max_new)
    return engine.generate(PROMPT, params, strategy, config, adapter=adapter).output_ids


def _logits(model, ids, adapters):
    with torch.no_grad(), lora_rows(model, [a or BASE_ADAPTER for a in adapters]):
        return model(input_ids=ids).logits


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_with_adapter_equals_merged_weights(
    name, base, resident, make_adapter, merge_adapter, tokenizer
):
    strategy, config = STRATEGIES[name]
    reference_base = _generate(copy.deepcopy(base), tokenizer, "ar", None)
    paths = {f"v{i}@1": make_adapter(f"v{i}", base, seed=i) for i in range(2)}
    merged = {key: merge_adapter(base, path) for key, path in paths.items()}
    for key, path in paths.items():
        resident.ensure(key, path)
    for key in paths:
        want = _generate(merged[key], tokenizer, "ar", None)
        assert want != reference_base  # the adapter really changes the output
        assert _generate(resident.model, tokenizer, strategy, config, adapter=key) == want
    # base rows are the untouched base
    assert (
        _generate(resident.model, tokenizer, strategy, config, adapter=BASE_ADAPTER)
        == reference_base
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_batch_of_three_adapters_and_base_equals_rows_alone(
    seed, resident, base, make_adapter
):
    names = [f"t{i}@1" for i in range(3)]
    for i, key in enumerate(names):
        resident.ensure(key, make_adapter(f"t{i}", base, seed=10 * seed + i))
    rows = [names[0], None, names[2], names[1], None]
    ids = torch.randint(0, 96, (len(rows), 9), generator=torch.Generator().manual_seed(seed))
    batched = _logits(resident.model, ids, rows)  # [rows, seq, vocab]
    for r, adapter in enumerate(rows):
        alone = _logits(resident.model, ids[r : r + 1], [adapter])
        torch.testing.assert_close(batched[r : r + 1], alone, rtol=0, atol=1e-5)
        assert torch.equal(batched[r].argmax(-1), alone[0].argmax(-1))
    assert not torch.allclose(batched[0], _logits(resident.model, ids[:1], [None])[0])


def test_lru_evicts_least_recent_and_unloads(resident, base, make_adapter):
    paths = {f"a{i}@1": make_adapter(f"a{i}", base, seed=i) for i in range(4)}
    for key in ["a0@1", "a1@1", "a2@1"]:
        resident.ensure(key, paths[key])
    resident.ensure("a0@1", paths["a0@1"])  # a hit makes a0 most recent
    resident.ensure("a3@1", paths["a3@1"])  # evicts a1, the least recent
    assert resident.names == ["a2@1", "a0@1", "a3@1"]
    assert resident.store.names == ["a0@1", "a2@1", "a3@1"]  # a1's tensors are gone
    assert resident.resident_bytes == resident.store.resident_bytes
    assert (resident.stats.loads, resident.stats.hits, resident.stats.evictions) == (4, 1, 1)
    assert resident.stats.load_seconds_total > 0


def test_eviction_by_bytes(base, make_adapter, adapter_root):
    probe = ResidentAdapters(copy.deepcopy(base), [BASE], AdapterLimits(root=adapter_root))
    probe.ensure("p@1", make_adapter("p", base))
    one = probe.resident_bytes
    limits = AdapterLimits(root=adapter_root, max_resident_bytes=2 * one + 1)
    resident = ResidentAdapters(base, [BASE], limits)
    for i in range(3):
        resident.ensure(f"b{i}@1", make_adapter(f"b{i}", base, seed=i))
    assert resident.names == ["b1@1", "b2@1"] and resident.resident_bytes == 2 * one


def test_reloaded_adapter_gives_same_outputs(resident, base, make_adapter):
    paths = {f"c{i}@1": make_adapter(f"c{i}", base, seed=i) for i in range(4)}
    ids = torch.arange(12)[None]
    resident.ensure("c0@1", paths["c0@1"])
    before = _logits(resident.model, ids, ["c0@1"])
    for key in ["c1@1", "c2@1", "c3@1"]:
        resident.ensure(key, paths[key])
    assert "c0@1" not in resident.names
    resident.ensure("c0@1", paths["c0@1"])
    torch.testing.assert_close(_logits(resident.model, ids, ["c0@1"]), before, rtol=0, atol=0)


def test_held_adapters_are_not_evicted(resident, base, make_adapter):
    paths = {f"h{i}@1": make_adapter(f"h{i}", base, seed=i) for i in range(4)}
    for key in ["h0@1", "h1@1", "h2@1"]:
        resident.ensure(key, paths[key])
    with resident.hold("h0@1"), resident.hold("h1@1"), resident.hold("h2@1"):
        with pytest.raises(errors.AdapterCapacityError):
            resident.ensure("h3@1", paths["h3@1"])
        assert resident.names == ["h0@1", "h1@1", "h2@1"]
    with resident.hold("h0@1"):
        resident.ensure("h3@1", paths["h3@1"])
    assert resident.names == ["h0@1", "h2@1", "h3@1"]
    assert resident.stats.refusals == {"adapter_capacity": 1}


def _break(kind, path, tmp_path):
    cfg_path, weights = path / "adapter_config.json", path / "adapter_model.safetensors"
    cfg = json.loads(cfg_path.read_text())
    if kind == "pickle":
        (path / "adapter_model.bin").write_bytes(b"\x80\x04.")
    elif kind == "missing":
        weights.unlink()
    elif kind == "corrupt":
        weights.write_bytes(weights.read_bytes()[:100])
    elif kind == "base_name":
        cfg_path.write_text(json.dumps({**cfg, "base_model_name_or_path": "other"}))
    elif kind == "targets":
        cfg_path.write_text(json.dumps({**cfg, "target_modules": ["nope_proj"]}))
    elif kind == "rank":
        cfg_path.write_text(json.dumps({**cfg, "r": 1000}))
    elif kind == "outside":
        return tmp_path
    return path


@pytest.mark.parametrize(
    "kind", ["pickle", "missing", "corrupt", "base_name", "targets", "rank", "outside"]
)
def test_refusal_leaves_base_and_resident_adapters_untouched(
    kind, resident, base, make_adapter, tmp_path
):
    resident.ensure("ok@1", make_adapter("ok", base, seed=3))
    ids = torch.arange(10)[None]
    before = {a: _logits(resident.model, ids, [a]) for a in ["ok@1", None]}
    bad = _break(kind, make_adapter("bad", base, seed=4), tmp_path)
    with pytest.raises(errors.AdapterError):
        resident.ensure("bad@1", bad)
    assert resident.names == ["ok@1"] and resident.store.names == ["ok@1"]
    for adapter, logits in before.items():
        torch.testing.assert_close(_logits(resident.model, ids, [adapter]), logits, rtol=0, atol=0)
    assert sum(resident.stats.refusals.values()) == 1


def test_the_model_stays_the_plain_base(resident, base, make_adapter, tmp_path):
    bad = _break("pickle", make_adapter("bad", base), tmp_path)
    with pytest.raises(errors.PickleFormatError):
        resident.ensure("bad@1", bad)
    resident.ensure("ok@1", make_adapter("ok", base, seed=3))
    assert resident.model is base and type(base).__name__ == "LlamaForCausalLM"
    assert not [n for n, _ in base.named_parameters() if "lora" in n]  # nothing injected


def test_engine_refuses_unknown_adapter(resident, base, make_adapter, tokenizer):
    resident.ensure("k@1", make_adapter("k", base))
    with pytest.raises(ValueError, match="not resident"):
        Engine(resident.model, tokenizer, frozenset()).start(PROMPT, adapter="zz@1")
    plain = copy.deepcopy(base)  # a copy has no store: it takes no adapters
    with pytest.raises(ValueError, match="takes no adapters"):
        Engine(plain, tokenizer, frozenset()).start(PROMPT, adapter="k@1")


@pytest.mark.parametrize("name", ["__base__", "a.b@1", "", "x" * 200])
def test_bad_adapter_names_refused(resident, base, make_adapter, name):
    with pytest.raises(ValueError, match="adapter name"):
        resident.ensure(name, make_adapter("n", base))


def test_none_means_the_models_default_and_base_adapter_means_base(resident, base, make_adapter):
    """On a store model None is the base (no adapter is ever 'active'); mixed with names,
    None rows are base rows."""
    resident.ensure("only@1", make_adapter("only", base, seed=9))
    ids = torch.arange(12)[None].repeat(2, 1)
    with torch.no_grad():
        plain = resident.model(input_ids=ids).logits
    torch.testing.assert_close(_logits(resident.model, ids, [None, None]), plain, rtol=0, atol=0)
    mixed = _logits(resident.model, ids, ["only@1", None])
    torch.testing.assert_close(mixed[1], plain[1], rtol=0, atol=0)
    assert not torch.allclose(mixed[0], plain[0], atol=1e-3)


def test_concurrent_prepares_of_one_cold_adapter_convert_it_once(
    resident, base, make_adapter, monkeypatch
):
    """Requests racing for the same cold adapter share one validation and conversion; a late
    duplicate hand-over is a hit, not a second load."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import specserve.adapters.resident as module

    path = make_adapter("p", base)
    calls = []
    real = module.validate_adapter

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "validate_adapter", slow)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: resident.prepare("p@1", path), range(4)))
    assert len(calls) == 1 and all(g is got[0] for g in got)
    assert resident.install(got[0]).sha256 == got[0].adapter.sha256
    assert resident.prepare("p@1", path) is None  # resident now
    resident.install(got[1])
    assert (resident.stats.loads, resident.stats.hits) == (1, 1)
    assert got[0].adapter.weights == b""  # the file bytes are not kept


def test_a_load_whose_bytes_differ_from_the_registered_digest_is_refused(
    resident, base, make_adapter
):
    from specserve.adapters.fingerprint import adapter_sha256

    path = make_adapter("v", base, seed=5)
    registered = adapter_sha256(path)
    other = make_adapter("other", base, seed=6)
    (path / "adapter_model.safetensors").write_bytes(
        (other / "adapter_model.safetensors").read_bytes()  # same shapes, other values
    )
    with pytest.raises(errors.AdapterDigestError) as refused:
        resident.prepare("v@1", path, registered)
    assert refused.value.code == "adapter_digest_mismatch"
    assert resident.names == [] and resident.store.names == []
    assert resident.stats.refusals == {"adapter_digest_mismatch": 1}
    assert resident.ensure("v@1", path, adapter_sha256(path)).sha256 == adapter_sha256(path)
