"""Cost curve: padded widths and relative costs against a brute-force reference; measuring on a
tiny model; the cache is read instead of remeasuring."""

from __future__ import annotations

import random

import pytest

from specserve.engine.tuning import cost
from specserve.engine.tuning.cost import CostCurve, load_or_measure, measure_cost_curve


def _curve(ms: dict[int, float]) -> CostCurve:
    return CostCurve(model_id="m", device="cpu", dtype="torch.float32", context=200, ms=ms)


def _ref_padded(ms: dict[int, float], k: int) -> int:
    best = None
    for size in sorted(ms):  # cheapest measured width that fits; ties -> the smaller
        if size >= k and (best is None or ms[size] < ms[best]):
            best = size
    return k if best is None else best


def test_docstring_examples():
    bumpy = _curve({1: 58, 2: 97, 4: 84, 5: 74})
    assert bumpy.padded_width(2) == 5
    assert bumpy.padded_width(1) == 1
    assert bumpy.padded_width(9) == 9  # beyond the largest measured width
    flat = _curve({1: 100, 8: 150, 16: 160})
    assert flat.relative(1) == 1.0
    assert flat.relative(5) == 1.5
    assert flat.relative(32) == pytest.approx(3.2)


def test_padded_width_matches_reference_on_random_curves():
    rng = random.Random(0)
    for _ in range(200):
        sizes = sorted(rng.sample(range(1, 65), rng.randint(1, 10)))
        ms = {s: rng.uniform(10, 100) for s in sizes}
        curve = _curve(ms)
        for k in range(1, 70):
            assert curve.padded_width(k) == _ref_padded(ms, k)
            if k <= max(ms):
                assert curve.relative(k) == pytest.approx(ms[_ref_padded(ms, k)] / ms[min(ms)])


def test_measure_on_a_tiny_model(tiny_llama):
    curve = measure_cost_curve(tiny_llama(0), "tiny", sizes=(1, 3, 8), context=20, repeats=2)
    assert set(curve.ms) == {1, 3, 8} and all(v > 0 for v in curve.ms.values())
    assert set(curve.tree_ms) == {3, 8} and all(v > 0 for v in curve.tree_ms.values())
    assert curve.device == "cpu" and curve.context == 20


def test_relative_tree_docstring_example():
    curve = _curve({1: 100, 4: 110, 8: 120}).model_copy(update={"tree_ms": {4: 118, 8: 131}})
    assert curve.relative_tree(4) == pytest.approx(1.18)
    assert curve.relative_tree(2) == pytest.approx(1.1)  # no tree that narrow: the chain's
    assert curve.relative_tree(8) == pytest.approx(1.31)
    cheap = _curve({1: 100, 4: 110}).model_copy(update={"tree_ms": {4: 105}})
    assert cheap.relative_tree(4) == pytest.approx(1.1)  # never below the chain of that width
    assert _curve({1: 100, 4: 110}).relative_tree(4) == pytest.approx(1.1)  # none measured


def test_a_curve_cached_without_trees_is_measured_again(tmp_path, tiny_llama, monkeypatch):
    model = tiny_llama(0)
    old = _curve({1: 1.0, 4: 2.0})
    path = cost.cost_curve_path(tmp_path, "tiny", model.device, cost.forward_key(model))
    path.parent.mkdir(parents=True)
    path.write_text(old.model_dump_json())
    fresh = old.model_copy(update={"tree_ms": {4: 2.4}})
    monkeypatch.setattr(cost, "measure_cost_curve", lambda model, model_id: fresh)
    assert load_or_measure(model, "tiny", tmp_path) == fresh
    assert cost.CostCurve.model_validate_json(path.read_text()) == fresh


def test_load_or_measure_reads_the_cache(tmp_path, tiny_llama, monkeypatch):
    model = tiny_llama(0)
    calls = []

    def fake_measure(model, model_id):
        calls.append(model_id)
        return _curve({1: 1.0, 4: 2.0}).model_copy(update={"tree_ms": {4: 2.5}})

    monkeypatch.setattr(cost, "measure_cost_curve", fake_measure)
    first = load_or_measure(model, "tiny", tmp_path)
    again = load_or_measure(model, "tiny", tmp_path)
    assert calls == ["tiny"] and again == first
    load_or_measure(model, "tiny", tmp_path, remeasure=True)
    assert calls == ["tiny", "tiny"]
