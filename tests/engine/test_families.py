"""THE GATE across model families (tiny random configs, fp32): every strategy alone equals greedy
`generate()`; random Scheduler batches with mixed adapters equal each request alone; LoRA on each
family's own projections equals its merged weights. Windowed families have a window shorter than
prompt + generation, so drafts are rolled back across it.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from conftest import FAMILIES, WINDOW, make_tiny_family
from schedules import STRATEGIES, alone, prompt, requests, run, with_adapters

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.engine import families, hf_internals
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)

LORA_TARGETS = {  # each family's own module names: fused projections where it has them
    "phi3": ("qkv_proj", "gate_up_proj", "down_proj"),
    "gpt_neox": ("query_key_value", "dense_4h_to_h"),
}
ADAPTERS = ["v1", "v2", "v3"]
MAX_NEW = 24


def _drafters(model):
    from conftest import _random_drafter

    return {
        "medusa": _random_drafter(model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": _random_drafter(model, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [prompt(rng, 14), prompt(rng, 30)]  # both longer than WINDOW


def _greedy(model, ids: list[int], max_new: int = MAX_NEW) -> list[int]:
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False
    )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_strategy_alone_equals_generate(family, tokenizer):
    model = make_tiny_family(family)
    families.family_of(model.config)
    engine = Engine(model, tokenizer, frozenset(), drafters=_drafters(model))
    accepted = 0
    for ids in _prompts():
        want = _greedy(model, ids)
        for strategy, config in STRATEGIES.items():
            res = engine.generate(ids, SamplingParams(max_new_tokens=MAX_NEW), strategy, config)
            assert res.output_ids == want, (family, strategy)
            accepted += res.forwards < MAX_NEW  # some step committed more than one token
    assert accepted  # drafts were accepted too, not only rolled back


def _lora_model(family: str):
    """The family's tiny model holding three resident adapters on its own projections."""
    targets = LORA_TARGETS.get(family, ("q_proj", "v_proj", "down_proj"))
    return with_adapters(make_tiny_family(family, seed=1), ADAPTERS, targets)


@pytest.mark.parametrize("family", FAMILIES)
def test_scheduler_batches_equal_each_request_alone(family, tokenizer):
    """Mixed adapters and strategies, chunked prefill, joins and cancellations."""
    model = _lora_model(family)
    engine = Engine(model, tokenizer, frozenset(), drafters=_drafters(model))
    reqs = requests(11, 10, ADAPTERS)
    scheduler = Scheduler(engine, BatchSettings(max_batch=5, prefill_chunk=16))
    seen = run(engine, scheduler, reqs)
    checked = 0
    for i, req in enumerate(reqs):
        want = alone(engine, req)
        if seen[i].get("cancelled"):
            assert want[: len(seen[i]["ids"])] == seen[i]["ids"]
            continue
        assert seen[i]["ids"] == want, (family, i, req["strategy"], req["adapter"])
        checked += 1
    assert checked >= 6
    assert seen[-1]["max_rows"] >= 3 and len(seen[-1]["adapters"]) >= 2
    assert scheduler.active() == 0 and scheduler.kv.rows == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_on_the_familys_projections_equals_merged_weights(
    family, tokenizer, make_adapter, merge_adapter, adapter_root
):
    """The serving path: the adapter file validated into the base's LoRAStore (no peft)."""
    from conftest import BASE_NAME

    base = copy.deepcopy(make_tiny_family(family, seed=1))
    targets = LORA_TARGETS.get(family, ("q_proj", "v_proj", "down_proj"))
    path = make_adapter("v", base, targets=targets, scale=0.5)
    merged = merge_adapter(base, path)
    ResidentAdapters(base, [BASE_NAME], AdapterLimits(root=adapter_root)).ensure("v", path)
    engine = Engine(base, tokenizer, frozenset(), drafters=_drafters(base))
    for ids in _prompts():
        want = _greedy(merged, ids)
        assert want != _greedy(make_tiny_family(family, seed=1), ids)  # the adapter matters
        for strategy, config in STRATEGIES.items():
            params = SamplingParams(max_new_tokens=MAX_NEW)
            res = engine.generate(ids, params, strategy, config, adapter="v")
            assert res.output_ids == want, (family, strategy)
            res = engine.generate(ids, params, strategy, config, adapter=BASE_ADAPTER)
            assert res.output_ids == _greedy(make_tiny_family(family, seed=1), ids)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_windowed_cache_stays_bounded(family, tokenizer):
    """Windowed layers hold at most window - 1 positions after every step, however long."""
    model = make_tiny_family(family)
    engine = Engine(model, tokenizer, frozenset())
    state = engine.start(_prompts()[1], SamplingParams(max_new_tokens=200), "prompt_lookup")
    windows = hf_internals.layer_windows(model.config)
    held = []
    for _ in engine.stream(state):
        held.append(max(lay.held() for lay, w in zip(state.cache.layers, windows) if w))
    assert len(state.output_ids) == 200 and max(held) == WINDOW - 1
    full = [lay for lay, w in zip(state.cache.layers, windows) if not w]
    assert all(lay.get_seq_length() >= len(state.tokens) - 1 for lay in full)  # all of it
    length = hf_internals.cache_length(state.cache)
    assert length >= len(state.tokens) - 1
    assert all(lay.get_seq_length() == length for lay in state.cache.layers)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_from_a_hugging_face_directory(family, tmp_path, tiny_hf_tokenizer):
    from specserve.models.load import load_model

    make_tiny_family(family).save_pretrained(tmp_path)
    tiny_hf_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32")
    assert type(loaded.model) is type(make_tiny_family(family))
    ids = _prompts()[0]
    engine = Engine.from_loaded(loaded)
    res = engine.generate(ids, SamplingParams(max_new_tokens=8, ignore_eos=True), "prompt_lookup")
    assert res.output_ids == _greedy(make_tiny_family(family), ids, 8)


def _bloom():
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=64, hidden_size=16, n_layer=1, n_head=2)
    return BloomForCausalLM(config).eval()


def test_an_architecture_outside_the_list_the_probe_refuses_is_refused_with_its_check(
    tmp_path, tokenizer
):
    """Bloom is outside the known-good list; the conformance probe refuses it (tests/engine/
    test_probe.py checks which architectures it admits), at construction and at load."""
    from specserve.models.catalog import ModelLoadError
    from specserve.models.load import load_model

    refused = r"'bloom' \(BloomForCausalLM\) is not in the known-good list \(llama, .*gemma2"
    with pytest.raises(families.UnsupportedModel, match=refused + ".*probe refused it: "):
        Engine(_bloom(), tokenizer, frozenset())
    _bloom().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot serve .*" + refused):
        load_model(str(tmp_path), device="cpu", dtype="float32")


def test_the_supported_list_is_the_gate_list():
    """Every family the registry admits is one THE GATE above runs."""
    gated = {make_tiny_family(f).config.model_type for f in FAMILIES}
    assert gated == set(families.FAMILIES)


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_batched_window_layers_stay_bounded_and_exact(family, tokenizer):
    """Long generations in a batch: a window group's columns stay near its window (compacted
    when it holds twice that) while full-attention layers hold everything; outputs as alone."""
    model = make_tiny_family(family)
    engine = Engine(model, tokenizer, frozenset())
    scheduler = Scheduler(engine, BatchSettings(max_batch=3, prefill_chunk=64))
    reqs = [
        {"prompt": ids, "strategy": s, "max_new": 120, "adapter": None}
        for ids, s in zip(_prompts() + [_prompts()[0][:9]], ["prompt_lookup", "lookahead", "ar"])
    ]

    def start(req):
        params = SamplingParams(max_new_tokens=120)
        return engine.start(req["prompt"], params, req["strategy"], STRATEGIES[req["strategy"]])

    outs = {}
    for i, req in enumerate(reqs):
        state = start(req)
        outs[i] = []
        scheduler.submit(state, "t", True, lambda r, done, i=i: r and outs[i].extend(r.new_ids))
    window_columns, full_columns = [], []
    while scheduler.active():
        scheduler.step()
        for g in scheduler.kv.groups:
            (full_columns if g.window is None else window_columns).append(g.columns)
    assert max(window_columns) <= 2 * (WINDOW - 1) + 16 + 8  # + one forward's new columns
    if family == "gemma3":
        assert max(full_columns) >= 120
    for i, req in enumerate(reqs):
        state = start(req)
        for _ in engine.stream(state):
            pass
        assert outs[i] == state.output_ids == _greedy(model, req["prompt"], 120)
