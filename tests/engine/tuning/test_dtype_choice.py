"""`--dtype auto`: the choice rule on the serving step's figures, its measurement through the
scheduler on a tiny model, and its cache."""

from __future__ import annotations

import json

import pytest
import torch

from specserve.engine.lora.batch import takes_adapters
from specserve.engine.tuning import dtype_choice, dtype_serving
from specserve.engine.tuning.dtype_serving import ServingFigures, ServingMix
from specserve.models.load import load_model

FP32, BF16 = "torch.float32", "torch.bfloat16"
# a tiny model's step: 16 rows at short contexts, a few steps (seconds in all, both dtypes)
TINY_MIX = ServingMix(
    prompt_tokens=(6, 9, 14, 20, 31, 40), new_tokens=16, steps=6, alone_steps=2, warmup_steps=1
)


def _figures(tok_s: float, alone: float, rows: int = 16) -> ServingFigures:
    return ServingFigures(
        rows=rows, tok_s=tok_s, alone_tok_s=alone, steps=16, prefill_tokens=600, seconds=2.0
    )


def _choice(model_id: str, costs: dict, chosen: str, rows: int = 16) -> dtype_choice.DtypeChoice:
    """A cached choice as `measure_choice` would write it, with made-up figures."""
    return dtype_choice.DtypeChoice(
        model_id=model_id,
        device="cpu",
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        workload=dtype_choice.Workload(rows=rows),
        costs=costs,
        chosen=chosen,
        reason="test",
    )


def test_pick_never_takes_a_dtype_slower_under_load():
    """A machine where bf16 is faster per plain forward and alone, slower at 16 rows."""
    chosen, reason = dtype_choice.pick({FP32: _figures(34.3, 20.0), BF16: _figures(30.7, 32.0)})
    assert chosen == FP32
    assert reason.startswith("16-row serving step: bf16 30.7 tok/s, fp32 34.3 tok/s")
    assert "1 row: bf16 32.0, fp32 20.0" in reason and "faster under load" in reason


def test_pick_takes_the_faster_dtype_under_load_past_the_margin():
    chosen, reason = dtype_choice.pick({FP32: _figures(34.3, 28.0), BF16: _figures(40.0, 25.0)})
    assert chosen == BF16 and "1.17x faster under load" in reason  # even if slower alone
    chosen, reason = dtype_choice.pick({FP32: _figures(34.3, 28.0), BF16: _figures(35.5, 27.0)})
    assert chosen == FP32 and "within 1.05x" in reason  # 1.035x: noise, fp32 is exact
    chosen, reason = dtype_choice.pick({BF16: _figures(90.0, 30.0)})
    assert chosen == BF16 and "only candidate" in reason


def test_pick_takes_a_dtype_as_fast_under_load_and_faster_alone():
    """A Zen 4 (avx512_bf16): 16 rows within noise of fp32, one request 1.5x faster in bf16."""
    chosen, reason = dtype_choice.pick({FP32: _figures(69.1, 14.9), BF16: _figures(66.3, 22.3)})
    assert chosen == BF16
    assert reason.endswith("bfloat16 (as fast under load (0.96x), 1.50x alone)")
    # a tie under load and alone: fp32, the exact mode
    chosen, reason = dtype_choice.pick({FP32: _figures(69.1, 14.9), BF16: _figures(66.3, 15.4)})
    assert chosen == FP32 and "faster under load" in reason
    # 0.92x under load is slower, whatever bf16 gains alone
    chosen, _ = dtype_choice.pick({FP32: _figures(100.0, 14.9), BF16: _figures(92.0, 30.0)})
    assert chosen == FP32


def test_row_contexts_and_arrival_order_examples():
    assert dtype_serving.row_contexts((10, 20, 30, 40), 2) == [20, 40]
    assert dtype_serving.row_contexts((10, 20, 30, 40), 6) == [10, 20, 20, 30, 40, 40]
    lengths = dtype_serving.SPECBENCH_PROMPT_TOKENS
    assert dtype_serving.row_contexts(lengths, 16) == list(lengths)
    assert dtype_serving.arrival_order((10, 20, 30, 100)) == [30, 20, 100, 10]
    order = dtype_serving.arrival_order(lengths)
    assert sorted(order) == sorted(lengths)
    assert abs(sum(order[:2]) / 2 - sum(lengths) / len(lengths)) < 60  # a window's 2 arrivals


def test_contexts_are_cut_to_what_the_model_holds():
    mix = dtype_serving.fitted(ServingMix(), 256)
    assert max(mix.prompt_tokens) == 124 and mix.alone_context == 124
    assert dtype_serving.fitted(ServingMix(), None) == ServingMix()


def test_candidates_per_device():
    assert dtype_choice.candidates(torch.device("cpu")) == [torch.float32, torch.bfloat16]
    assert dtype_choice.candidates(torch.device("cuda")) == [torch.bfloat16]


def test_dtype_of():
    assert dtype_choice.dtype_of("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="not a torch dtype"):
        dtype_choice.dtype_of("torch.nothing")


def test_measure_times_the_serving_step_of_each_candidate(tiny_llama):
    """End to end on a tiny model: 16 rows through the scheduler (LoRA rows, arrivals prefilled
    in chunks within the window), and 1 row; the model measured is left as it was."""
    model = tiny_llama(0)
    attention = model.config._attn_implementation
    choice = dtype_choice.measure_choice(model, "tiny", mix=TINY_MIX)
    assert set(choice.costs) == {FP32, BF16} and choice.workload.rows == 16
    for figures in choice.costs.values():
        assert figures.rows == 16 and figures.steps == TINY_MIX.steps
        assert figures.tok_s > 0 and figures.alone_tok_s > 0
        assert figures.prefill_tokens > 0  # finished rows were replaced and prefilled in-window
        assert len(figures.windows) == TINY_MIX.rounds and figures.tok_s == max(figures.windows)
    assert (choice.chosen, choice.reason) == dtype_choice.pick(choice.costs)
    assert choice.reason.startswith("16-row serving step: bf16 ")
    assert choice.threads == torch.get_num_threads()
    assert model.dtype == torch.float32 and not takes_adapters(model)
    assert model.config._attn_implementation == attention


def test_the_window_is_bounded_in_time(tiny_llama):
    bounded = TINY_MIX.model_copy(update={"steps": 10_000, "seconds": 0.3, "rounds": 1})
    figures = dtype_serving.measure_serving(tiny_llama(0), [torch.float32], bounded)[FP32]
    assert 0 < figures.steps < 10_000 and figures.seconds < 5


def test_auto_measures_once_then_reads_the_cache(tmp_path, save_tiny_model_dir, monkeypatch):
    model_dir = save_tiny_model_dir(tmp_path / "m")
    first = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert first.dtype_choice is not None and first.dtype_choice.format == dtype_choice.FORMAT
    assert (
        str(first.dtype) == first.dtype_choice.chosen == str(next(first.model.parameters()).dtype)
    )
    assert "16-row serving step" in first.dtype_choice.reason
    path = dtype_choice.choice_path(tmp_path, first.model_id, "cpu", torch.get_num_threads())
    assert path.exists()

    def no_measuring(*_a, **_k):
        raise AssertionError("measured again")

    monkeypatch.setattr(dtype_choice, "measure_choice", no_measuring)
    again = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert again.dtype_choice == first.dtype_choice


def test_auto_follows_a_cached_bf16_choice(tmp_path, save_tiny_model_dir):
    """Whatever the cache says is what loads (here bf16, as on a core with AMX)."""
    model_dir = save_tiny_model_dir(tmp_path / "m")
    costs = {FP32: _figures(100.0, 28.0), BF16: _figures(150.0, 26.0)}
    dtype_choice.save_choice(tmp_path, _choice(str(model_dir.resolve()), costs, BF16))
    loaded = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    exact = load_model(str(model_dir), device="cpu", dtype="float32", cache_dir=tmp_path)
    assert exact.dtype == torch.float32 and exact.dtype_choice is None


def _format3(model_id: str) -> dict:
    """A cache `dtype_choice` FORMAT 3 wrote (plain forwards priced as a request)."""
    cost = {"ms": {"1": 60.0, "4": 70.0, "16": 160.0}, "prefill_ms_per_token": 2.4}
    return {
        "format": 3,
        "model_id": model_id,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "context": 200,
        "workload": {"prompt_tokens": 300, "new_tokens": 128, "rows": 1},
        "costs": {FP32: cost | {"request_ms": 8400.0}, BF16: cost | {"request_ms": 5000.0}},
        "chosen": BF16,
        "reason": "bf16 1.68x cheaper",
    }


@pytest.mark.parametrize("old", ["garbled", "format 3"])
def test_a_cache_of_an_older_format_is_measured_again(tmp_path, save_tiny_model_dir, old):
    model_dir = save_tiny_model_dir(tmp_path / "m")
    model_id = str(model_dir.resolve())
    path = dtype_choice.choice_path(tmp_path, model_id, "cpu", torch.get_num_threads())
    path.parent.mkdir(parents=True)
    text = json.dumps(_format3(model_id)) if old == "format 3" else '{"model_id": "x", "ms": {}}'
    path.write_text(text)
    assert dtype_choice.cached_choice(tmp_path, model_id, "cpu") is None
    loaded = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert loaded.dtype_choice is not None and loaded.dtype_choice.format == dtype_choice.FORMAT
    assert set(loaded.dtype_choice.costs[FP32].model_dump()) == set(ServingFigures.model_fields)


def test_a_choice_made_at_another_load_is_measured_again(tmp_path, save_tiny_model_dir):
    model_dir = save_tiny_model_dir(tmp_path / "m")
    model_id = str(model_dir.resolve())
    costs = {FP32: _figures(10.0, 5.0, rows=4), BF16: _figures(20.0, 9.0, rows=4)}
    dtype_choice.save_choice(tmp_path, _choice(model_id, costs, BF16, rows=4))
    four = dtype_choice.Workload(rows=4)
    assert dtype_choice.cached_choice(tmp_path, model_id, "cpu", four) is not None
    assert dtype_choice.cached_choice(tmp_path, model_id, "cpu") is None  # 16 rows: not this one
    replica = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert replica.dtype_choice.workload.rows == 16 and replica.dtype_choice.reason != "test"
