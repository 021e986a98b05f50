"""The tie check: pure pieces against slow references, and teeth (a broken verifier fails it)."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch

from specserve.engine import ties
from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams
from specserve.engine.tree import DraftTree

WIDE = {"max_ngram": 4, "min_ngram": 1, "draft_len": 8, "max_matches": 4}


def test_first_divergence_examples():
    assert ties.first_divergence([5, 6, 7], [5, 6, 8]) == 2
    assert ties.first_divergence([5, 6], [5, 6, 9]) == 2
    assert ties.first_divergence([5, 6, 9], [5, 6]) == 2
    assert ties.first_divergence([5], [5]) is None
    assert ties.first_divergence([], []) is None


def test_tie_gap_example():
    logits = torch.tensor([1.0, 3.0, 2.875])
    assert ties.tie_gap(logits, 1, 2) == pytest.approx(0.125)
    assert ties.tie_gap(logits, 1, 0) == pytest.approx(2.0)
    assert ties.tie_gap(logits, 1, 1) == 0.0


def _slow_gap_noise(x, y, top):
    worst = 0.0
    for r in range(x.shape[0]):
        order = sorted(range(x.shape[1]), key=lambda t: -float(x[r, t]))[:top]
        for i, j in itertools.product(order, order):
            change = (float(x[r, i]) - float(x[r, j])) - (float(y[r, i]) - float(y[r, j]))
            worst = max(worst, abs(change))
    return worst


def test_gap_noise_example_and_reference():
    assert ties.gap_noise(torch.tensor([[4.0, 3.0, 0.0]]), torch.tensor([[4.0, 3.25, 0.0]]), 2) == (
        pytest.approx(0.25)
    )
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(3, 20, generator=gen)
        y = x + 0.01 * torch.randn(3, 20, generator=gen)
        assert ties.gap_noise(x, y, 5) == pytest.approx(_slow_gap_noise(x, y, 5), abs=1e-6)


def _prompt(n, seed, vocab=96):
    rng = random.Random(seed)
    a = [rng.randrange(vocab) for _ in range(7)]
    b = [rng.randrange(vocab) for _ in range(5)]
    seq = []
    while len(seq) < n:
        seq += a + (b if rng.random() < 0.5 else [])
    return seq[:n]


def _outputs(engine, prompts, strategy, config=None):
    params = SamplingParams(max_new_tokens=40)
    return {q: engine.generate(p, params, strategy, config).output_ids for q, p in prompts.items()}


def _leaky_ancestor_mask(self):
    """Broken on purpose: every node also sees its siblings."""
    mask = DraftTree.__dict__["_real_ancestor_mask"](self)
    for i, p in enumerate(self.parents):
        for j, q in enumerate(self.parents):
            if q == p:
                mask[i, j] = True
    return mask


@pytest.fixture(scope="module")
def setup(tiny_llama, tokenizer):
    model = tiny_llama(1, init_range=0.1)
    engine = Engine(model, tokenizer, frozenset())
    prompts = {q: _prompt(60, 1000 + q) for q in range(12)}
    return model, engine, prompts, _outputs(engine, prompts, "ar")


def test_fp32_tolerance_is_rounding_only_and_outputs_identical(setup):
    model, engine, prompts, ref = setup
    tol = ties.measure_tolerance(model, list(prompts.values())[:2])
    assert tol.tolerance < 1e-4  # fp32: rounding noise only; outputs are still bit-exact
    check = ties.check_outputs(
        model, prompts, ref, _outputs(engine, prompts, "prompt_lookup", WIDE), 0.0
    )
    assert check.identical and check.all_ties and check.max_tie_gap is None


def test_a_verifier_whose_mask_leaks_siblings_fails_the_check(setup, monkeypatch):
    model, engine, prompts, ref = setup
    monkeypatch.setattr(DraftTree, "_real_ancestor_mask", DraftTree.ancestor_mask, raising=False)
    monkeypatch.setattr(DraftTree, "ancestor_mask", _leaky_ancestor_mask)
    broken = _outputs(engine, prompts, "prompt_lookup", WIDE)
    monkeypatch.undo()
    tolerance = ties.measure_tolerance(model, list(prompts.values())[:3]).tolerance
    check = ties.check_outputs(model, prompts, ref, broken, tolerance)
    assert not check.identical
    assert not check.all_ties
    assert check.max_tie_gap > 10 * tolerance
    assert all(d.tie == (d.tie_gap <= tolerance) for d in check.divergences)


def test_bf16_divergences_are_ties_within_the_measured_tolerance(setup, tokenizer):
    model, _, prompts, _ = setup
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    engine = Engine(bf16, tokenizer, frozenset())
    tol = ties.measure_tolerance(bf16, list(prompts.values()))
    assert 0.0 < tol.tolerance < 0.5
    ref = _outputs(engine, prompts, "ar")
    for strategy, config in (("prompt_lookup", WIDE), ("lookahead", None)):
        check = ties.check_outputs(
            bf16, prompts, ref, _outputs(engine, prompts, strategy, config), tol.tolerance
        )
        assert check.all_ties, (strategy, check)
