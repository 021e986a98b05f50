"""specserve.engine.batch.spec_budget: per-row acceptance, capped widths and the load-aware cap."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from specserve.engine.batch.spec_budget import (
    RowDraft,
    accept_rate,
    capped_width,
    choose_cap,
    expected_tokens,
)
from specserve.engine.tree import AuxBranch, Draft, DraftTree, cap_draft, draft_width
from specserve.engine.tuning.cost import CostCurve

CPU_MS = {1: 57, 4: 84, 8: 88, 16: 106, 32: 137, 64: 217}
TIE = 1e-4  # choose_cap keeps the smaller cap unless a larger one is better by this factor


def _cpu_relative():
    return CostCurve(model_id="m", device="cpu", dtype="f32", context=200, ms=CPU_MS).relative


def _chain(n: int) -> tuple[int, ...]:
    return tuple(range(1, n + 1))


# --- accept_rate / capped_width / expected_tokens ---------------------------------------------


def test_accept_rate_docstring_example():
    """drafted (10, 4), accepted (5, 1) gives 0.5 at depth 1 and 0.25 at depth 2."""
    row = RowDraft(depths=(1, 2), aux=0, drafted_by_depth=(10, 4), accepted_by_depth=(5, 1))
    assert accept_rate(row, 1) == pytest.approx(0.5, abs=1e-12)
    assert accept_rate(row, 2) == pytest.approx(0.25, abs=1e-12)


def test_accept_rate_without_history_is_the_prior_and_history_pulls_away():
    """No (or too short) history gives exactly 0.5**depth; a long history dominates the prior."""
    bare = RowDraft(depths=(1, 2, 3), aux=0)
    for d in range(1, 6):
        assert accept_rate(bare, d) == pytest.approx(0.5**d, abs=1e-12)
    short = RowDraft(depths=(1, 2, 3), aux=0, drafted_by_depth=(4,), accepted_by_depth=(4,))
    assert accept_rate(short, 1) == pytest.approx((4 + 1) / 6, abs=1e-12)
    assert accept_rate(short, 2) == pytest.approx(0.25, abs=1e-12)  # no history at depth 2
    sure = RowDraft(depths=(1,), aux=0, drafted_by_depth=(10**6,), accepted_by_depth=(10**6,))
    never = RowDraft(depths=(1,), aux=0, drafted_by_depth=(10**6,), accepted_by_depth=(0,))
    assert accept_rate(sure, 1) > 0.9999
    assert accept_rate(never, 1) < 1e-5


def test_capped_width_tree_prefix_then_aux_only_if_it_fits():
    """Tree nodes fill the cap first; the aux branch counts only when all of it fits after them."""
    row = RowDraft(depths=(1, 2, 1, 2, 3), aux=3)
    widths = [capped_width(row, cap) for cap in range(10)]
    assert widths == [0, 1, 2, 3, 4, 5, 5, 5, 8, 8]
    fixed = RowDraft(depths=(1, 2, 1, 2, 3), aux=3, load_aware=False)
    assert [capped_width(fixed, cap) for cap in range(10)] == [8] * 10


def test_expected_tokens_sums_rates_down_to_the_kept_prefix_depth():
    """expected = 1 + sum of rates to the deepest node among the first `cap` nodes."""
    row = RowDraft(
        depths=(1, 1, 2, 3, 2), aux=2, drafted_by_depth=(10, 4), accepted_by_depth=(5, 1)
    )
    r1, r2, r3 = 0.5, 0.25, 0.125  # docstring rates at depths 1, 2; prior at depth 3
    assert expected_tokens(row, 0) == pytest.approx(1.0)
    assert expected_tokens(row, 1) == pytest.approx(1 + r1)
    assert expected_tokens(row, 2) == pytest.approx(1 + r1)  # second node is also depth 1
    assert expected_tokens(row, 3) == pytest.approx(1 + r1 + r2)
    for cap in (4, 5, 7, 100):
        assert expected_tokens(row, cap) == pytest.approx(1 + r1 + r2 + r3)
    fixed = RowDraft(row.depths, row.aux, row.drafted_by_depth, row.accepted_by_depth, False)
    assert expected_tokens(fixed, 0) == pytest.approx(1 + r1 + r2 + r3)  # never cut


def _random_depths(rng: random.Random, n: int) -> tuple[int, ...]:
    """Depths of a random tree whose nodes are in topological order."""
    depths: list[int] = []
    for i in range(n):
        p = rng.randrange(-1, i)
        depths.append(1 if p < 0 else depths[p] + 1)
    return tuple(depths)


def _aux(n: int) -> AuxBranch:
    return AuxBranch(tuple(range(n)), tuple(range(1, n + 1)), torch.eye(n, dtype=torch.bool), ())


@pytest.mark.parametrize("seed", range(10))
def test_capped_width_and_depth_agree_with_cap_draft(seed):
    """capped_width / expected_tokens describe exactly the draft tree.cap_draft produces."""
    rng = random.Random(seed)
    n = rng.randrange(0, 12)
    parents = tuple(rng.randrange(-1, i) for i in range(n))
    tree = DraftTree(tuple(range(n)), parents)
    a = rng.choice([0, rng.randrange(1, 6)])
    draft = Draft(tree, _aux(a) if a else None)
    row = RowDraft(tree.depths, a)
    for cap in range(n + a + 2):
        cut = cap_draft(draft, cap)
        assert capped_width(row, cap) == draft_width(cut)
        depth = max(cut.tree.depths, default=0)
        assert expected_tokens(row, cap) == pytest.approx(
            1 + sum(0.5**d for d in range(1, depth + 1))
        )


# --- choose_cap ---------------------------------------------------------------------------------


def test_choose_cap_docstring_example():
    """16 rows of 4-node chains at rate ~0.5: a flat curve keeps 4, a linear curve picks 0."""
    big = 10**6
    row = RowDraft(
        depths=_chain(4),
        aux=0,
        drafted_by_depth=(big,) * 4,
        accepted_by_depth=(big // 2,) * 4,
    )
    for d in range(1, 5):
        assert accept_rate(row, d) == pytest.approx(0.5, abs=1e-5)
    rows = [row] * 16
    assert choose_cap(rows, lambda k: 1.0) == 4
    assert choose_cap(rows, lambda k: float(k)) == 0


def test_choose_cap_none_without_a_load_aware_row():
    """No load-aware row (or no row at all) means no cut: None, even under a steep cost."""
    fixed = RowDraft(depths=_chain(8), aux=4, load_aware=False)
    assert choose_cap([fixed, fixed], lambda k: float(k) ** 2) is None
    assert choose_cap([], lambda k: float(k)) is None
    mixed = [fixed, RowDraft(depths=_chain(8), aux=0)]
    assert choose_cap(mixed, lambda k: float(k) ** 2) is not None


def test_choose_cap_counts_fixed_rows_in_the_padded_width():
    """A fixed row of width 8 pads every row to 9 queries, so cutting the others saves nothing:
    under a linear curve the load-aware row keeps its whole chain (alone it would get 0)."""
    aware = RowDraft(depths=_chain(8), aux=0)
    fixed = RowDraft(depths=_chain(8), aux=0, load_aware=False)
    assert choose_cap([aware], float) == 0
    assert choose_cap([aware, fixed], float) == 8


def _ref_rate(rows: list[RowDraft], cost, cap: int) -> float:
    """Committed tokens per unit cost at `cap`, computed from the definitions with plain loops."""
    total, widest = 0.0, 0
    for r in rows:
        if r.load_aware:
            tree = min(len(r.depths), cap)
            aux = r.aux if r.aux <= cap - tree else 0
        else:
            tree, aux = len(r.depths), r.aux
        widest = max(widest, tree + aux)
        deepest = 0
        for depth in r.depths[:tree]:
            deepest = max(deepest, depth)
        tokens = 1.0
        for d in range(1, deepest + 1):
            drafted = r.drafted_by_depth[d - 1] if d <= len(r.drafted_by_depth) else 0
            accepted = r.accepted_by_depth[d - 1] if d <= len(r.accepted_by_depth) else 0
            tokens += (accepted + 2.0 * 0.5**d) / (drafted + 2.0)
        total += tokens
    return total / cost(len(rows) * (1 + widest))


def _random_rows(rng: random.Random) -> list[RowDraft]:
    rows = []
    for _ in range(rng.randint(1, 6)):
        depths = _random_depths(rng, rng.randint(0, 20))
        deepest = max(depths, default=0)
        drafted = tuple(rng.randint(0, 50) for _ in range(rng.randint(0, deepest)))
        accepted = tuple(rng.randint(0, d) for d in drafted)
        aux = rng.choice([0, 0, rng.randint(1, 10)])
        rows.append(RowDraft(depths, aux, drafted, accepted, rng.random() < 0.85))
    if not any(r.load_aware for r in rows):
        r = rows[0]
        rows[0] = RowDraft(r.depths, r.aux, r.drafted_by_depth, r.accepted_by_depth, True)
    return rows


def _random_monotone_cost(rng: random.Random, largest: int):
    """cost(1) = 1, non-decreasing, flat stretches and jumps (like a padded measured curve)."""
    values, c = {1: 1.0}, 1.0
    for k in range(2, largest + 1):
        c += rng.choice([0.0, 0.0, rng.random() * 0.3])
        values[k] = c

    def cost(k: int) -> float:
        return values[k]

    return cost


@pytest.mark.parametrize("seed", range(50))
def test_choose_cap_matches_brute_force_over_every_cap(seed):
    """The chosen cap's rate is the best over every cap 0..widest, up to choose_cap's 1e-4 tie
    margin; a clear unique best is chosen exactly."""
    rng = random.Random(seed)
    rows = _random_rows(rng)
    widest = max(len(r.depths) + r.aux for r in rows)
    cost = _random_monotone_cost(rng, len(rows) * (widest + 1))
    got = choose_cap(rows, cost)
    assert got is not None and 0 <= got <= widest
    candidates = list(range(widest + 1))
    rates = {c: _ref_rate(rows, cost, c) for c in candidates}
    best = max(rates.values())
    assert _ref_rate(rows, cost, got) >= best * (1 - TIE) - 1e-12
    clear = [c for c in candidates if rates[c] >= best * (1 - 2 * TIE)]
    if len(clear) == 1:
        assert got == clear[0]
    # ties go to the smaller cap: every smaller candidate is worse than the chosen one
    assert all(rates[c] < rates[got] for c in candidates if c < got)


def test_choose_cap_ties_go_to_the_smaller_cap():
    """When more draft adds nothing (every rate ~0) at equal cost, the smallest cap wins."""
    hopeless = RowDraft(
        depths=_chain(8), aux=0, drafted_by_depth=(10**9,) * 8, accepted_by_depth=(0,) * 8
    )
    assert choose_cap([hopeless] * 4, lambda k: 1.0) == 0


def test_choose_cap_is_optimal_over_every_cap_on_the_cpu_curve():
    """Brute force over every cap 0..widest: one bare 12-node chain under the CPU curve."""
    rows = [RowDraft(depths=_chain(12), aux=0)]
    cost = _cpu_relative()
    rates = [_ref_rate(rows, cost, c) for c in range(13)]
    got = choose_cap(rows, cost)
    assert rates[got] >= max(rates) * (1 - 1e-4)


@pytest.mark.parametrize(
    "row",
    [
        RowDraft(_chain(8), 0, (100,) * 8, (90, 80, 70, 60, 50, 40, 30, 20)),
        RowDraft((1, 2, 3, 1, 2, 4, 5, 6), 4),
        RowDraft(_chain(12), 8, (10,) * 12, (9, 8, 7, 6, 5, 5, 4, 4, 3, 3, 2, 2)),
    ],
)
def test_cap_shrinks_as_identical_rows_grow_on_the_cpu_curve(row):
    """Doubling the batch (1..64 identical rows) never raises the cap; one row speculates, a
    64-row batch turns speculation off."""
    cost = _cpu_relative()
    caps = [choose_cap([row] * n, cost) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a >= b for a, b in itertools.pairwise(caps)), caps
    assert caps[0] > 0 and caps[-1] == 0, caps
