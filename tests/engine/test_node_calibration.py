"""Per-variant calibration of draft-node scores: the docstring's worked example, the bins, and a
slow reference."""

from __future__ import annotations

import math
import random

import pytest

from specserve.engine.node_calibration import BINS, NodeCalibration, bin_of


def test_bins_example():
    assert [bin_of(p) for p in (1.0, 0.6, 0.5, 0.3, 0.2, 1e-9, 0.0)] == [0, 0, 1, 1, 2, 7, 7]


def test_worked_example():
    cal = NodeCalibration(prior=2.0)
    cal.record([("prompt", 0.6, i < 3) for i in range(10)])
    assert cal.factor("prompt", 0.6) == pytest.approx(5 / 8)
    assert cal.calibrated("prompt", 0.6) == pytest.approx(0.375)
    assert cal.calibrated("prompt", 0.3) == 0.3  # another bin: never verified
    assert cal.calibrated("pool", 0.6) == 0.6  # another source


def test_an_underconfident_bin_rises_but_never_past_one():
    cal = NodeCalibration(prior=1.0)
    cal.record([("eagle", 0.55, True)] * 20)  # predicted 11, accepted 20
    assert cal.factor("eagle", 0.55) == pytest.approx(21 / 12)
    assert cal.calibrated("eagle", 0.52) == pytest.approx(0.52 * 21 / 12)
    assert cal.calibrated("eagle", 0.95) == 1.0  # same bin: 0.95 * 21 / 12 > 1


def test_against_a_slow_reference():
    """factor = (accepted in the bin + prior) / (sum of predictions in the bin + prior)."""
    rng = random.Random(0)
    cal = NodeCalibration(prior=3.0)
    outcomes = [
        (rng.choice(["eagle", "prompt", "pool"]), rng.random() ** 3, rng.random() < 0.4)
        for _ in range(500)
    ]
    for start in range(0, 500, 7):  # steps of a few nodes each
        cal.record(outcomes[start : start + 7])
    for source in ("eagle", "prompt", "pool"):
        for b in range(BINS):
            lo, hi = 2.0 ** -(b + 1), 2.0**-b
            inside = [
                (p, a)
                for s, p, a in outcomes
                if s == source and (lo < p <= hi or (b == BINS - 1 and p <= hi))
            ]
            want = (sum(a for _, a in inside) + 3.0) / (sum(p for p, _ in inside) + 3.0)
            probe = hi if b < BINS - 1 else 1e-6
            assert cal.factor(source, probe) == pytest.approx(want), (source, b)
    predicted = sum(p for s, p, _ in outcomes if s == "pool")
    assert math.isclose(sum(p for p, _ in cal.snapshot()["pool"]), predicted, rel_tol=1e-3)


def test_the_prior_must_be_positive():
    with pytest.raises(ValueError):
        NodeCalibration(prior=0)
