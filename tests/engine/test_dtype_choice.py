"""`--dtype auto`: the choice rule, its measurement and its cache."""

from __future__ import annotations

import pytest
import torch

from specserve.engine import dtype_choice
from specserve.engine.models import load_model


def test_pick_examples():
    chosen, reason = dtype_choice.pick({"torch.float32": 60.0, "torch.bfloat16": 38.0})
    assert chosen == "torch.bfloat16" and "1.58x faster" in reason
    chosen, reason = dtype_choice.pick({"torch.float32": 60.0, "torch.bfloat16": 58.0})
    assert chosen == "torch.float32" and "within 1.05x" in reason
    chosen, reason = dtype_choice.pick({"torch.float32": 40.0, "torch.bfloat16": 900.0})
    assert chosen == "torch.float32" and "fastest" in reason
    assert dtype_choice.pick({"torch.bfloat16": 22.0})[0] == "torch.bfloat16"


def test_candidates_per_device():
    assert dtype_choice.candidates(torch.device("cpu")) == [torch.float32, torch.bfloat16]
    assert dtype_choice.candidates(torch.device("cuda")) == [torch.bfloat16]


def test_dtype_of():
    assert dtype_choice.dtype_of("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="not a torch dtype"):
        dtype_choice.dtype_of("torch.nothing")


def test_measure_times_each_candidate(tiny_llama):
    choice = dtype_choice.measure_choice(tiny_llama(0), "tiny", context=20, repeats=1)
    assert set(choice.ms) == {"torch.float32", "torch.bfloat16"}
    assert all(set(v) == {1, 4} and min(v.values()) > 0 for v in choice.ms.values())
    expected, _ = dtype_choice.pick({d: v[1] for d, v in choice.ms.items()})
    assert choice.chosen == expected and choice.threads == torch.get_num_threads()


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
    choice = dtype_choice.DtypeChoice(
        model_id=str(model_dir.resolve()),
        device="cpu",
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        context=200,
        ms={"torch.float32": {1: 60.0, 4: 88.0}, "torch.bfloat16": {1: 38.0, 4: 39.0}},
        chosen="torch.bfloat16",
        reason="test",
    )
    dtype_choice.save_choice(tmp_path, choice)
    loaded = load_model(str(model_dir), device="cpu", dtype="auto", cache_dir=tmp_path)
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    exact = load_model(str(model_dir), device="cpu", dtype="float32", cache_dir=tmp_path)
    assert exact.dtype == torch.float32 and exact.dtype_choice is None
