"""Tuning: every candidate is measured, the choice maximizes τ / mean step cost, and it is cached."""

from __future__ import annotations

import json

from specserve.engine.decode.engine import Engine
from specserve.engine.tuning import drafts as tuning
from specserve.engine.tuning.cost import CostCurve, cost_curve_path
from specserve.engine.tuning.drafts import cached_choices, load_or_tune, tune, tuned_path, with_cost

PROMPT = [5, 6, 7, 8, 9] * 6


def _curve(ms):
    return CostCurve(model_id="tiny", device="cpu", dtype="torch.float32", context=20, ms=ms)


def test_choice_follows_the_cost_curve(tiny_llama, tokenizer):
    engine = Engine(tiny_llama(0), tokenizer, frozenset())
    grid = [{"draft_len": 1, "max_matches": 1}, {"draft_len": 8, "max_matches": 4}]
    cheap = tune(engine, "prompt_lookup", _curve({1: 1.0, 64: 1.0}), [PROMPT], 24, grid)
    costly = tune(engine, "prompt_lookup", _curve({1: 1.0, 2: 3.0, 64: 50.0}), [PROMPT], 24, grid)
    assert [t.config for t in cheap.trials] == grid
    for tuned in (cheap, costly):
        assert tuned.config == tuned.best.config
        for t in tuned.trials:
            assert t.predicted_speedup == t.tau / t.mean_cost
    # free width: the longest drafts win; expensive width: the shortest
    assert cheap.config == grid[1]
    assert costly.config == grid[0]


def test_load_or_tune_caches(tmp_path, tiny_llama, tokenizer, monkeypatch):
    engine = Engine(tiny_llama(0), tokenizer, frozenset())
    curve = _curve({1: 1.0, 8: 1.2})
    monkeypatch.setitem(tuning.CANDIDATES, "lookahead", [{"window": 2, "ngram": 3, "guesses": 1}])
    first = load_or_tune(engine, "lookahead", curve, [PROMPT], tmp_path)
    path = tuned_path(tmp_path, curve, "lookahead")
    assert json.loads(path.read_text())["config"] == first.config
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    assert load_or_tune(engine, "lookahead", curve, [PROMPT], tmp_path) == first


def test_with_cost_gives_the_hybrid_chain_and_tree_costs():
    curve = _curve({1: 10.0, 4: 12.0}).model_copy(update={"tree_ms": {4: 13.0}})
    priced = with_cost("hybrid", {"budget": 6}, curve)
    assert priced == {
        "budget": 6,
        "relative_cost": {1: 1.0, 4: 1.2},
        "relative_tree_cost": {4: 1.3},
    }
    assert with_cost("hybrid", {"relative_cost": {1: 1.0}}, curve) == {"relative_cost": {1: 1.0}}
    assert with_cost("lookahead", {}, curve) == {}  # sizes its drafts otherwise


def test_an_untuned_strategy_is_served_with_the_cached_curve(tmp_path):
    """A server reading the cache: a tuned config as tuned; an untuned hybrid's defaults priced
    by the curve (its budget follows the device); strategies that take no curve: nothing."""
    curve = _curve({1: 10.0, 8: 15.0}).model_copy(update={"tree_ms": {8: 16.0}})
    path = cost_curve_path(tmp_path, "tiny", "cpu", "torch.float32")
    path.parent.mkdir(parents=True)
    path.write_text(curve.model_dump_json())
    got, configs = cached_choices(tmp_path, "tiny", "cpu", "torch.float32", ["hybrid", "lookahead"])
    assert got == curve
    assert configs == {
        "hybrid": {"relative_cost": {1: 1.0, 8: 1.5}, "relative_tree_cost": {8: 1.6}}
    }
    assert cached_choices(tmp_path / "none", "tiny", "cpu", "torch.float32", ["hybrid"]) == (
        None,
        {},
    )
