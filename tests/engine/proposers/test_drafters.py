"""THE GATE for trained drafters: `medusa` and `eagle` with randomly initialized weights decode
exactly what `ar` does (greedy), over tiny random Llamas, prompt lengths and tree shapes; and
the features the engine hands them are the target's own (checked against a plain forward).
"""

from __future__ import annotations

import random

import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec
from specserve.engine.sampling import SamplingParams

MODELS = {"loopy": (0, 0.02), "mid": (1, 0.1), "wander": (2, 0.2)}
MAX_NEW = 32
SHAPES = {
    "medusa-chain1": ("medusa", {"tree_size": 1}, {}),
    "medusa-4": ("medusa", {"tree_size": 4}, {}),
    "medusa-16": ("medusa", {"tree_size": 16}, {}),
    "medusa-wide": ("medusa", {"tree_size": 12, "accept_rates": [[0.3] * 6, [0.2] * 6]}, {}),
    "eagle-chain": ("eagle", {"depth": 5, "topk": 1, "total_tokens": 5}, {}),
    "eagle-d4k3n10": ("eagle", {"depth": 4, "topk": 3, "total_tokens": 10}, {}),
    "eagle-d2k8n16": ("eagle", {"depth": 2, "topk": 8, "total_tokens": 16}, {}),
    "eagle-d6k2n4": ("eagle", {"depth": 6, "topk": 2, "total_tokens": 4}, {}),
    "eagle3-fused": ("eagle", {"depth": 3, "topk": 3, "total_tokens": 8}, {"layers": (0, -1)}),
}

pytestmark = pytest.mark.timeout(180)


def _prompt(n: int, seed: int, vocab: int = 96) -> list[int]:
    rng = random.Random(seed)
    a = [rng.randrange(vocab) for _ in range(6)]
    return (a * (n // 6 + 1))[:n]


def _spec(kind: str, extra: dict):
    if kind == "medusa":
        return MedusaSpec(heads=3, topk=6)
    return EagleSpec(feature_layers=extra.get("layers", (-1,)))


@pytest.fixture(scope="module")
def engines(tiny_llama, tokenizer, random_drafter):
    out = {}
    for name, (seed, init) in MODELS.items():
        model = tiny_llama(seed, init_range=init)
        drafters = {}
        for shape, (kind, _, extra) in SHAPES.items():
            drafters[shape] = random_drafter(model, _spec(kind, extra), seed=seed, scale=0.1)
        out[name] = (model, drafters)
    return out


def _engine(model, tokenizer, drafter, pad_width=None) -> Engine:
    return Engine(model, tokenizer, frozenset(), pad_width, drafters={drafter.kind: drafter})


@pytest.mark.parametrize("n_prompt", [1, 9, 60])
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_output_equals_ar(engines, tokenizer, shape, model_name, n_prompt):
    model, drafters = engines[model_name]
    kind, config, _ = SHAPES[shape]
    prompt = _prompt(n_prompt, MODELS[model_name][0])
    params = SamplingParams(max_new_tokens=MAX_NEW)
    engine = _engine(model, tokenizer, drafters[shape])
    ref = engine.generate(prompt, params, "ar")
    got = engine.generate(prompt, params, kind, config)
    assert got.output_ids == ref.output_ids
    assert got.strategy == kind and got.finish_reason == "length"
    assert 1 <= got.forwards <= MAX_NEW


@pytest.mark.parametrize("shape", ["medusa-16", "eagle-d4k3n10"])
def test_padded_widths_and_eos_equal_ar(engines, tokenizer, shape):
    model, drafters = engines["loopy"]
    kind, config, _ = SHAPES[shape]
    prompt = _prompt(20, 0)
    plain = _engine(model, tokenizer, drafters[shape])
    ref = plain.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW), "ar")
    padded = _engine(model, tokenizer, drafters[shape], pad_width=lambda k: k + 3)
    got = padded.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW), kind, config)
    assert got.output_ids == ref.output_ids
    eos = ref.output_ids[10]
    stop = Engine(model, tokenizer, frozenset({eos}), drafters={kind: drafters[shape]})
    ref_eos = stop.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW), "ar")
    got_eos = stop.generate(prompt, SamplingParams(max_new_tokens=MAX_NEW), kind, config)
    assert got_eos.output_ids == ref_eos.output_ids and got_eos.finish_reason == "stop"


@torch.inference_mode()
def test_features_are_the_targets_own(engines, tokenizer):
    """Every feature handed to the proposer equals the target's final feature at that position
    in one plain causal forward over the committed sequence."""
    model, drafters = engines["mid"]
    kind, config, _ = SHAPES["eagle-d4k3n10"]
    engine = _engine(model, tokenizer, drafters["eagle-d4k3n10"])
    state = engine.start(_prompt(9, 1), SamplingParams(max_new_tokens=MAX_NEW), kind, config)
    seen: list[tuple[int, torch.Tensor]] = []  # (first position, features)
    original = state.proposer.observe_features

    def spy(features, tokens):
        seen.append((len(tokens) - 1 - features.shape[0], features.clone()))
        original(features, tokens)

    state.proposer.observe_features = spy
    for _ in engine.stream(state):
        pass
    out = model(input_ids=torch.tensor([state.tokens]), output_hidden_states=True)
    ref = hf_internals.hidden_features(out, (-1,))[0]  # [T, 1, H]
    covered = 0
    for start, feats in seen:
        assert start == covered  # contiguous: each position exactly once, in order
        assert torch.allclose(feats, ref[start : start + feats.shape[0]], atol=1e-4)
        covered += feats.shape[0]
    assert covered >= len(state.tokens) - 1 - (MAX_NEW // 2)


@torch.inference_mode()
def test_eagle_draft_cache_equals_a_fresh_pass(engines, tokenizer):
    """After decoding, the draft layer's cache (built incrementally from the target features
    handed over at each commit, tree rows dropped) equals one causal pass of the draft layer
    over the whole committed sequence."""
    model, drafters = engines["wander"]
    kind, config, _ = SHAPES["eagle-d4k3n10"]
    drafter = drafters["eagle-d4k3n10"]
    engine = _engine(model, tokenizer, drafter)
    state = engine.start(_prompt(9, 2), SamplingParams(max_new_tokens=20), kind, config)
    for _ in engine.stream(state):
        pass
    prop = state.proposer
    tokens = state.tokens
    out = model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    feats = hf_internals.hidden_features(out, (-1,))[0, : prop.committed]  # [c, 1, H]
    fresh = hf_internals.empty_cache()
    c = prop.committed
    from specserve.engine.drafters.modules import additive_mask

    e = model.get_input_embeddings()(torch.tensor([tokens[1 : c + 1]]))
    mask = additive_mask(torch.ones(c, c, dtype=torch.bool).tril(), torch.float32)[None, None]
    pos = torch.arange(c)[None]
    drafter.module(e, drafter.module.input_feature(feats)[None], mask, pos, model, fresh)
    assert hf_internals.cache_length(prop.cache) == c
    for a, b in zip(prop.cache.layers, fresh.layers, strict=True):
        assert torch.allclose(a.keys, b.keys, atol=1e-4)
        assert torch.allclose(a.values, b.values, atol=1e-4)


def test_drafts_are_accepted_when_the_drafter_is_right(tiny_llama, tokenizer, random_drafter):
    """A Medusa drafter whose tree rates force many candidates reaches τ > 1 on a looping
    model; an EAGLE tree of 40 nodes too: acceptance is exercised, output still equals ar."""
    model = tiny_llama(0, init_range=0.02)
    prompt = _prompt(30, 0)
    params = SamplingParams(max_new_tokens=48)
    for kind, spec, config in [
        (
            "medusa",
            MedusaSpec(heads=2, topk=48),
            {"tree_size": 60, "accept_rates": [[0.9] * 48, [0.01] * 48]},
        ),
        ("eagle", EagleSpec(), {"depth": 2, "topk": 20, "total_tokens": 60}),
    ]:
        drafter = random_drafter(model, spec, seed=3, scale=0.02)
        engine = _engine(model, tokenizer, drafter)
        ref = engine.generate(prompt, params, "ar")
        got = engine.generate(prompt, params, kind, config)
        assert got.output_ids == ref.output_ids
        assert got.tau > 1.2, (kind, got.tau)


def test_missing_drafter_is_a_clear_error(model, tokenizer):
    engine = Engine(model, tokenizer, frozenset())
    for kind in ("medusa", "eagle"):
        with pytest.raises(ValueError, match=f"strategy '{kind}' needs a trained"):
            engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4), kind)


def test_medusa_with_own_heads_equals_ar(tiny_llama, tokenizer, random_drafter):
    model = tiny_llama(1, init_range=0.1)
    vocab = torch.arange(0, 96, 2)
    drafter = random_drafter(model, MedusaSpec(heads=3, topk=4, own_head=48), vocab=vocab)
    engine = _engine(model, tokenizer, drafter)
    prompt = _prompt(20, 1)
    params = SamplingParams(max_new_tokens=MAX_NEW)
    got = engine.generate(prompt, params, "medusa", {"tree_size": 8})
    assert got.output_ids == engine.generate(prompt, params, "ar").output_ids
    state = engine.start(prompt, params, "medusa", {"tree_size": 8})
    engine.step(state)
    assert set(state.proposer.vocab.tolist()) == set(vocab.tolist())  # own heads: no prompt ids
    assert all(t % 2 == 0 for t in state.proposer.propose(state.tokens).tree.tokens)


@pytest.fixture(scope="module")
def lora_model(tiny_llama):
    """A peft-wrapped tiny Llama whose adapter really changes the output."""
    from schedules import with_adapters

    return with_adapters(tiny_llama(1, init_range=0.1), ["default"], peft=True)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_drafters_on_a_peft_wrapped_target_equal_ar(
    lora_model, tiny_llama, tokenizer, random_drafter, kind
):
    spec = MedusaSpec(heads=2, topk=4) if kind == "medusa" else EagleSpec(feature_layers=(0, -1))
    drafter = random_drafter(lora_model, spec, seed=2, scale=0.1)
    engine = _engine(lora_model, tokenizer, drafter)
    prompt = _prompt(15, 1)
    params = SamplingParams(max_new_tokens=MAX_NEW)
    ref = engine.generate(prompt, params, "ar")
    base = Engine(tiny_llama(1, init_range=0.1), tokenizer, frozenset())
    assert base.generate(prompt, params, "ar").output_ids != ref.output_ids  # adapter matters
    config = {"tree_size": 6} if kind == "medusa" else {"depth": 3, "topk": 2, "total_tokens": 6}
    assert engine.generate(prompt, params, kind, config).output_ids == ref.output_ids
