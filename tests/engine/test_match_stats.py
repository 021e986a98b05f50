"""Per-source, per-depth acceptance counts: the docstring's worked example and a slow reference."""

from __future__ import annotations

import random

import pytest

from specserve.engine.match_stats import MatchStats, common_prefix


def test_worked_example():
    stats = MatchStats(prior=(1.0, 1.0))
    stats.record("prompt:2", verified=3, matched=1)
    assert stats.rate("prompt:2", 1) == pytest.approx(2 / 3)
    assert stats.rate("prompt:2", 2) == pytest.approx(1 / 3)
    assert stats.rate("prompt:2", 3) == 0.5
    assert stats.rate("pool", 1) == 0.5  # another source: only the prior


def test_against_a_slow_reference():
    """rate(d) = (chains accepting depth d + a) / (chains reaching depth d + a + b)."""
    rng = random.Random(0)
    stats = MatchStats(prior=(2.0, 3.0))
    outcomes = []
    for _ in range(300):
        verified = rng.randrange(0, 7)
        matched = rng.randrange(0, verified + 1)
        outcomes.append((verified, matched))
        stats.record("s", verified, matched)
    for depth in range(1, 7):
        reached = sum(1 for v, m in outcomes if min(m + 1, v) >= depth)
        accepted = sum(1 for v, m in outcomes if m >= depth)
        assert stats.rate("s", depth) == pytest.approx((accepted + 2) / (reached + 5))


def test_nothing_verified_records_nothing():
    stats = MatchStats()
    stats.record("s", verified=0, matched=0)
    assert stats.snapshot() == {}


def test_common_prefix():
    assert common_prefix([5, 6, 7], [5, 6, 9]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_a_call_may_bring_its_own_prior():
    stats = MatchStats()
    assert stats.rate("pool", 1, (1.0, 9.0)) == 0.1  # unmeasured: the call's prior
    stats.record("pool", 1, 1)
    assert stats.rate("pool", 1, (1.0, 9.0)) == (1 + 1) / (1 + 10)
    assert stats.rate("pool", 1) == (1 + 1) / (1 + 2)
