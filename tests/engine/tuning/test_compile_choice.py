"""The compile decision: modes, the cached measurement `auto` follows, and its cache file."""

from __future__ import annotations

import torch

from specserve.engine.forward.compiled import CompileRecord
from specserve.engine.tuning import compile_choice


def _record(eager: float = 53.4, compiled: float = 35.8, diff: float = 0.0) -> CompileRecord:
    return CompileRecord(
        model_id="m",
        device="cpu",
        dtype="torch.bfloat16",
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        eager_ms={1: eager, 4: 115.0},
        compiled_ms={1: compiled, 4: 86.8},
        start_s=420.0,
        max_abs_diff=diff,
    )


def test_on_and_off_are_what_they_say():
    for mode, enabled in (("on", True), ("off", False)):
        assert compile_choice.decide(mode, _record(), torch.bfloat16).enabled is enabled
        assert compile_choice.decide(mode, None, torch.float32).enabled is enabled


def test_auto_without_a_measurement_stays_eager_and_says_how_to_measure():
    decision = compile_choice.decide("auto", None, torch.bfloat16)
    assert not decision.enabled
    assert "--compile on" in decision.reason


def test_auto_compiles_only_on_a_measured_gain():
    assert compile_choice.decide("auto", _record(53.4, 35.8), torch.bfloat16).enabled
    low = compile_choice.decide("auto", _record(53.4, 52.0), torch.bfloat16)
    assert not low.enabled and "below 1.05x" in low.reason
    assert _record(53.4, 35.8).gain == 53.4 / 35.8


def test_auto_keeps_float32_exact():
    inexact = compile_choice.decide("auto", _record(diff=1e-6), torch.float32)
    assert not inexact.enabled and "bit-exact" in inexact.reason
    assert compile_choice.decide("auto", _record(diff=0.0), torch.float32).enabled
    assert compile_choice.decide("auto", _record(diff=0.125), torch.bfloat16).enabled


def test_record_round_trip_and_torch_version_invalidates(tmp_path):
    record = _record()
    path = compile_choice.save_record(tmp_path, record)
    assert path.parent == tmp_path / "costs"
    again = compile_choice.cached_record(tmp_path, "m", "cpu", "torch.bfloat16")
    assert again == record
    assert compile_choice.cached_record(tmp_path, "m", "cpu", "torch.float32") is None
    stale = record.model_copy(update={"torch": "0.0.1"})
    compile_choice.save_record(tmp_path, stale)
    assert compile_choice.cached_record(tmp_path, "m", "cpu", "torch.bfloat16") is None
