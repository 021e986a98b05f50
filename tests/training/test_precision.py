"""The drafter training's precision: `auto` resolved by the target's dtype and this device's
measured bf16 speed-up; explicit settings kept."""

from __future__ import annotations

import pytest
import torch

from specserve.training import precision


def _never() -> float:
    raise AssertionError("measured although the setting decides alone")


@pytest.mark.parametrize(
    ("setting", "dtype", "speedup", "want"),
    [
        ("auto", torch.float32, 2.4, "bfloat16"),  # Zen 4 / AMX: bf16 products ~2.4x faster
        ("auto", torch.float32, 0.3, "off"),  # AVX2 only: bf16 emulated, slower
        ("auto", torch.float32, precision.MIN_SPEEDUP, "bfloat16"),
        ("auto", torch.float32, precision.MIN_SPEEDUP - 0.01, "off"),
    ],
)
def test_auto_follows_the_measured_speedup_for_an_fp32_target(setting, dtype, speedup, want):
    assert precision.resolve(setting, dtype, lambda: speedup) == want


@pytest.mark.parametrize(
    ("setting", "dtype", "want"),
    [
        ("auto", torch.bfloat16, "bfloat16"),  # served in bf16: train as served
        ("auto", torch.float16, "off"),
        ("off", torch.bfloat16, "off"),
        ("bfloat16", torch.float32, "bfloat16"),
    ],
)
def test_the_setting_or_the_dtype_decides_without_measuring(setting, dtype, want):
    assert precision.resolve(setting, dtype, _never) == want


def test_bf16_speedup_is_a_measured_ratio():
    got = precision.bf16_speedup(torch.device("cpu"), rows=64, repeats=1)
    assert 0.01 < got < 100
