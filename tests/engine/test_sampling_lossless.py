"""Sampled speculative decoding is lossless: `lookahead` samples the same distribution as `ar`.

A tiny-vocabulary model with moderately flat next-token distributions; a prompt whose last token
has several continuations in the prompt, so lookahead drafts several branches and some get
accepted. The first three generated tokens of many requests, seeded (each its own seed) and
unseeded, are compared with a chi-square two-sample test, and the same test must catch a subtly
biased acceptance rule. (Seeded, each request equals `ar` with its seed: tests/engine/test_seeded.py.)
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from specserve.engine.decode import core as decode
from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams
from specserve.engine.seeded import seeded_tokens

VOCAB = 10
PROMPT = [2, 3, 4, 2, 5, 6, 2, 7, 1, 2, 8, 9, 2]  # "2" is followed by 3, 5, 7, 8 in the prompt
LOOKAHEAD = {"window": 2, "ngram": 3, "guesses": 3}
N = 2400
ALPHA = 1e-3

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def engine(tiny_llama, tokenizer):
    model = tiny_llama(3, vocab=VOCAB, hidden=32, init_range=0.3)
    return Engine(model, tokenizer, frozenset())


def _sample(engine, strategy, config=None, seeds=range(N)):
    outs, taus = [], []
    for seed in seeds:
        params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=seed)
        res = engine.generate(PROMPT, params, strategy, config)
        assert len(res.output_ids) == 3
        outs.append(tuple(res.output_ids))
        taus.append(res.tau)
    return outs, float(np.mean(taus))


@pytest.fixture(scope="module")
def ar_samples(engine):
    # disjoint seeds from the speculative runs: two independent samples
    outs, tau = _sample(engine, "ar", seeds=range(10**6, 10**6 + N))
    assert tau == 1.0
    return outs


def _two_sample_pvalue(a: list, b: list, min_expected: float = 5.0) -> float:
    """Chi-square test of homogeneity; sparse categories are pooled into one."""
    ca, cb = Counter(a), Counter(b)
    cats = sorted(set(ca) | set(cb))
    table = np.array([[ca[c] for c in cats], [cb[c] for c in cats]], dtype=float)
    total = table.sum(axis=0)
    expected_min = total * min(table.sum(axis=1)) / table.sum()
    big = expected_min >= min_expected
    cols = [table[:, big]]
    if (~big).any():
        cols.append(table[:, ~big].sum(axis=1, keepdims=True))
    table = np.concatenate(cols, axis=1)
    table = table[:, table.sum(axis=0) > 0]
    return float(chi2_contingency(table).pvalue)


def _pvalues(ar: list[tuple[int, ...]], spec: list[tuple[int, ...]]) -> dict[str, float]:
    return {
        "token1": _two_sample_pvalue([o[0] for o in ar], [o[0] for o in spec]),
        "token2": _two_sample_pvalue([o[1] for o in ar], [o[1] for o in spec]),
        "token3": _two_sample_pvalue([o[2] for o in ar], [o[2] for o in spec]),
        "tokens2,3": _two_sample_pvalue([o[1:] for o in ar], [o[1:] for o in spec]),
        "tokens1,2": _two_sample_pvalue([o[:2] for o in ar], [o[:2] for o in spec]),
    }


def test_lookahead_sampling_matches_ar(engine, ar_samples):
    spec, tau = _sample(engine, "lookahead", LOOKAHEAD)
    assert tau > 1.05  # drafts were really accepted, so the acceptance rule was exercised
    pvals = _pvalues(ar_samples, spec)
    assert min(pvals.values()) > ALPHA, pvals


def test_unseeded_lookahead_sampling_matches_unseeded_ar(engine):
    """No seed: each request draws its own random one; still the distribution of `ar`."""
    ar, tau = _sample(engine, "ar", seeds=[None] * N)
    assert tau == 1.0
    spec, tau = _sample(engine, "lookahead", LOOKAHEAD, seeds=[None] * N)
    assert tau > 1.05
    pvals = _pvalues(ar, spec)
    assert min(pvals.values()) > ALPHA / 10, pvals  # unseeded: a fresh sample each run


def _biased_seeded_accept(tree, target_probs, seed, next_position):
    """Wrong on purpose: take the first drafted child whenever the target gives it > 5%."""
    kids = tree.children[0]
    if kids and target_probs[0, tree.tokens[kids[0]]] > 0.05:
        (bonus,) = seeded_tokens(target_probs[kids[0] + 1 : kids[0] + 2], seed, [next_position + 1])
        return [kids[0]], bonus
    return _real_seeded_accept(tree, target_probs, seed, next_position)


_real_seeded_accept = decode.seeded_accept


@pytest.mark.parametrize("seeded", [True, False])
def test_biased_acceptance_is_detected(engine, ar_samples, monkeypatch, seeded):
    monkeypatch.setattr(decode, "seeded_accept", _biased_seeded_accept)
    # unseeded: fewer requests (the same rule with random seeds; detection needs far fewer)
    seeds = range(N) if seeded else [None] * (N // 3)
    spec, tau = _sample(engine, "lookahead", LOOKAHEAD, seeds=seeds)
    assert tau > 1.05
    pvals = _pvalues(ar_samples, spec)
    assert min(pvals.values()) < ALPHA, pvals  # the very test that passes above now fails


DRAFTER_CONFIGS = {
    "medusa": {"tree_size": 6, "accept_rates": [[0.4, 0.3, 0.2], [0.3, 0.2]]},
    "eagle": {"depth": 2, "topk": 3, "total_tokens": 6},
    "hybrid": {"budget": 8, "eagle": {"depth": 2, "topk": 3}},  # EAGLE + n-grams in one tree
}


@pytest.fixture(scope="module")
def drafter_engine(engine, random_drafter):
    from specserve.engine.drafters.modules import EagleSpec, MedusaSpec

    drafters = {
        "medusa": random_drafter(engine.model, MedusaSpec(heads=2, topk=3), seed=1, scale=0.3),
        "eagle": random_drafter(engine.model, EagleSpec(), seed=1, scale=0.3),
    }
    return Engine(engine.model, engine.tokenizer, frozenset(), drafters=drafters)


@pytest.mark.parametrize("kind", ["medusa", "eagle", "hybrid"])
def test_drafter_sampling_matches_ar(drafter_engine, ar_samples, kind):
    """Trees of deterministic top-k drafts, verified by recursive rejection sampling."""
    spec, tau = _sample(drafter_engine, kind, DRAFTER_CONFIGS[kind])
    assert tau > 1.05
    pvals = _pvalues(ar_samples, spec)
    assert min(pvals.values()) > ALPHA, pvals


@pytest.fixture(scope="module")
def windowed_engine(tokenizer):
    """A Mistral whose sliding window (4) is shorter than the prompt: every draft is verified
    and rolled back on window layers that already dropped positions."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.3,
        sliding_window=4,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(3)
    model = MistralForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Engine(model, tokenizer, frozenset())


def test_lookahead_sampling_matches_ar_on_a_windowed_model(windowed_engine):
    ar, tau = _sample(windowed_engine, "ar", seeds=range(10**6, 10**6 + N))
    assert tau == 1.0
    spec, tau = _sample(windowed_engine, "lookahead", LOOKAHEAD)
    assert tau > 1.05
    pvals = _pvalues(ar, spec)
    assert min(pvals.values()) > ALPHA, pvals
