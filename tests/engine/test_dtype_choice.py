"""`--dtype auto`: the choice rule, its measurement and its cache."""

from __future__ import annotations

import itertools

import pytest
import torch

from specserve.engine import dtype_choice
from specserve.models.load import load_model


def _cost(ms1: float, prefill: float, ms16: float | None = None) -> dtype_choice.DtypeCost:
    ms = {1: ms1} | ({16: ms16} if ms16 is not None else {})
    total = dtype_choice.request_ms(ms, prefill, dtype_choice.Workload())
    return dtype_choice.DtypeCost(ms=ms, prefill_ms_per_token=prefill, request_ms=total)


def _choice(model_id: str, costs: dict, chosen: str) -> dtype_choice.DtypeChoice:
    """A cached choice as `measure_choice` would write it, with made-up costs."""
    return dtype_choice.DtypeChoice(
        model_id=model_id,
        device="cpu",
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        context=200,
        workload=dtype_choice.Workload(),
        costs=costs,
        chosen=chosen,
        reason="test",
    )


def _slow_step_ms(ms: dict[int, float], rows: int) -> float:
    """Reference: walk the measured points; interpolate on the segment holding rows."""
    points = sorted(ms.items())
    for (a, ya), (b, yb) in itertools.pairwise(points):
        if a <= rows <= b:
            return ya + (yb - ya) * (rows - a) / (b - a)
    last, y = points[-1]
    return y * rows / last if rows > last else points[0][1]


def test_step_ms_examples_and_reference():
    ms = {1: 50.0, 4: 100.0, 16: 300.0}
    assert dtype_choice.step_ms(ms, 10) == pytest.approx(200.0)
    assert dtype_choice.step_ms(ms, 32) == pytest.approx(600.0)
    for rows in range(1, 40):
        assert dtype_choice.step_ms(ms, rows) == pytest.approx(_slow_step_ms(ms, rows)), rows


def test_request_ms_examples():
    alone = dtype_choice.Workload()
    assert dtype_choice.request_ms({1: 60.0}, 2.4, alone) == pytest.approx(8400.0)
    batched = dtype_choice.Workload(rows=16)
    assert dtype_choice.request_ms({1: 60.0, 16: 160.0}, 2.4, batched) == pytest.approx(2000.0)


def test_a_batch_can_flip_the_choice():
    """bf16 on an AVX2-only core (session 8's curve shape): cheaper for one row, a row's cost
    linear in the rows; fp32 rows nearly free. Alone bf16 wins; at 16 rows a step fp32 does."""
    fp32, bf16 = "torch.float32", "torch.bfloat16"
    costs = {fp32: _cost(98.0, 2.8, ms16=160.0), bf16: _cost(53.0, 2.8, ms16=311.0)}
    choice = _choice("m", costs, bf16)
    assert dtype_choice.pick(choice.costs)[0] == bf16
    served = dtype_choice.for_workload(choice, dtype_choice.Workload(rows=16))
    assert served.chosen == fp32 and "decode at 16 rows" in served.reason
    assert served.costs[fp32].request_ms < served.costs[bf16].request_ms
    assert served.costs[bf16].ms == choice.costs[bf16].ms  # nothing measured again
    assert dtype_choice.for_workload(choice, dtype_choice.Workload()) is choice


def test_pick_examples():
    fp32, bf16 = "torch.float32", "torch.bfloat16"
    chosen, reason = dtype_choice.pick({fp32: _cost(60, 2.45), bf16: _cost(38, 1.70)})
    assert chosen == bf16 and "1.57x cheaper" in reason
    chosen, reason = dtype_choice.pick({fp32: _cost(60, 2.45), bf16: _cost(58, 2.40)})
    assert chosen == fp32 and "within 1.05x" in reason
    # faster decode, far slower prefill (bf16 on an AVX2-only core): the request decides
    chosen, reason = dtype_choice.pick({fp32: _cost(60, 2.45), bf16: _cost(50, 16.0)})
    assert chosen == fp32 and "cheapest" in reason
    assert dtype_choice.pick({bf16: _cost(22, 0.1)})[0] == bf16


def test_candidates_per_device():
    assert dtype_choice.candidates(torch.device("cpu")) == [torch.float32, torch.bfloat16]
    assert dtype_choice.candidates(torch.device("cuda")) == [torch.bfloat16]


def test_dtype_of():
    assert dtype_choice.dtype_of("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="not a torch dtype"):
        dtype_choice.dtype_of("torch.nothing")


def test_measure_times_each_candidate(tiny_llama):
    choice = dtype_choice.measure_choice(tiny_llama(0), "tiny", context=20, repeats=1)
    assert set(choice.costs) == {"torch.float32", "torch.bfloat16"}
    for cost in choice.costs.values():
        assert set(cost.ms) == {1, 4, 16} and min(cost.ms.values()) > 0
        assert cost.prefill_ms_per_token > 0
        want = dtype_choice.request_ms(cost.ms, cost.prefill_ms_per_token, choice.workload)
        assert cost.request_ms == pytest.approx(want, abs=0.1)
    assert choice.chosen == dtype_choice.pick(choice.costs)[0]
    assert choice.threads == torch.get_num_threads()


def test_auto_measures_once_then_reads_the_cache(tmp_path, save_tiny_model_dir, monkeypatch):
    model_dir = save_tiny_model_dir(tmp_path / "m")
    first = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert first.dtype_choice is not None
    assert (
        str(first.dtype) == first.dtype_choice.chosen == str(next(first.model.parameters()).dtype)
    )
    path = dtype_choice.choice_path(tmp_path, first.model_id, "cpu", torch.get_num_threads())
    assert path.exists()

    def no_measuring(*_a, **_k):
        raise AssertionError("measured again")

    monkeypatch.setattr(dtype_choice, "measure_choice", no_measuring)
    again = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert again.dtype_choice == first.dtype_choice


def test_auto_follows_a_cached_bf16_choice(tmp_path, save_tiny_model_dir):
    """Whatever the cache says is what loads (here bf16, as on a Zen 4 core)."""
    model_dir = save_tiny_model_dir(tmp_path / "m")
    costs = {"torch.float32": _cost(60, 2.45), "torch.bfloat16": _cost(38, 1.7)}
    choice = _choice(str(model_dir.resolve()), costs, "torch.bfloat16")
    dtype_choice.save_choice(tmp_path, choice)
    loaded = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    exact = load_model(str(model_dir), device="cpu", dtype="float32", cache_dir=tmp_path)
    assert exact.dtype == torch.float32 and exact.dtype_choice is None


def test_a_cache_of_an_older_format_is_measured_again(tmp_path, save_tiny_model_dir):
    model_dir = save_tiny_model_dir(tmp_path / "m")
    path = dtype_choice.choice_path(
        tmp_path, str(model_dir.resolve()), "cpu", torch.get_num_threads()
    )
    path.parent.mkdir(parents=True)
    path.write_text('{"model_id": "x", "ms": {}}')
    loaded = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert loaded.dtype_choice is not None and loaded.dtype_choice.format == dtype_choice.FORMAT


def test_auto_prices_the_workload_it_is_given(tmp_path, save_tiny_model_dir):
    """One cached measurement; a command (1 row) and a replica (16 rows) may load different
    dtypes from it."""
    model_dir = save_tiny_model_dir(tmp_path / "m")
    fp32, bf16 = "torch.float32", "torch.bfloat16"
    costs = {fp32: _cost(98.0, 2.8, ms16=160.0), bf16: _cost(53.0, 2.8, ms16=311.0)}
    choice = _choice(str(model_dir.resolve()), costs, bf16)
    dtype_choice.save_choice(tmp_path, choice)
    alone = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert alone.dtype == torch.bfloat16
    batched = dtype_choice.Workload(rows=16)
    replica = load_model(
        str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path, workload=batched
    )
    assert replica.dtype == torch.float32 and replica.dtype_choice.workload.rows == 16
