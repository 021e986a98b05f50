"""A source gate's bookkeeping by its worked example: it runs the source while the measured
gain per step beats the source's share of the step's cost, and every `explore`-th step."""

from __future__ import annotations

import pytest

from specserve.engine.proposers.source_gate import GateConfig, SourceGate


def test_worked_example():
    gate = SourceGate(GateConfig(decay=0.5, warmup=1, explore=10))
    assert gate.run_now()  # warm-up
    gate.record_tokens(accepted=3, gain=2)
    gate.record_cost(0.01, 0.04)
    assert (gate.gain, gate.base) == (2.0, 2.0)
    assert gate.run_now()  # 2 / 2 = 1.0 > 0.01 / 0.04
    for _ in range(3):  # steps where the n-grams alone reached everything accepted
        gate.record_tokens(accepted=1, gain=0)
    assert gate.gain == pytest.approx(0.25) and gate.base == pytest.approx(2.0)
    assert not gate.run_now()  # 0.125 < 0.25
    assert gate.skipped == 1


def test_explores_every_nth_step_and_can_be_disabled():
    gate = SourceGate(GateConfig(warmup=0, explore=3))
    gate.record_tokens(accepted=0, gain=0)
    gate.record_cost(1.0, 1.0)
    assert [gate.run_now() for _ in range(6)] == [False, False, True, False, False, True]
    off = SourceGate(GateConfig(enabled=False))
    off.record_tokens(accepted=0, gain=0)
    off.record_cost(1.0, 1.0)
    assert all(off.run_now() for _ in range(5)) and off.skipped == 0


def test_runs_until_every_figure_is_measured():
    gate = SourceGate(GateConfig(warmup=0, explore=100))
    assert gate.run_now()
    gate.record_tokens(accepted=0, gain=0)
    assert gate.run_now()  # no seconds yet
    gate.record_cost(0.5, 1.0)
    assert not gate.run_now()
