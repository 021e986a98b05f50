"""Tree arithmetic against slow brute-force references; device-sized trees on synthetic curves."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from specserve.engine.drafters.budget import tree_config
from specserve.engine.drafters.trees import (
    choose_tree_size,
    expected_tau,
    greedy_tree,
    select_nodes,
    tree_depth,
)
from specserve.engine.tuning.cost import CostCurve


def _all_paths(acc):
    """Every path (ranks per depth) with its probability: the slow reference."""
    out = []
    for depth in range(1, len(acc) + 1):
        for ranks in itertools.product(*(range(len(acc[d])) for d in range(depth))):
            out.append((ranks, math.prod(acc[d][r] for d, r in enumerate(ranks))))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_greedy_tree_is_the_best_closed_set(seed):
    rng = random.Random(seed)
    acc = [[rng.random() for _ in range(3)] for _ in range(3)]  # ranks need not be sorted
    if seed % 2:
        acc = [sorted(row, reverse=True) for row in acc]
    for size in (1, 2, 5, 9):
        tree = greedy_tree(acc, size)
        paths = [p for p, _ in tree]
        assert len(paths) == size
        assert all(p[:-1] in paths[:i] for i, p in enumerate(paths) if len(p) > 1)  # parents first
        best = sorted(_all_paths(acc), key=lambda x: -x[1])[:size]
        assert sum(p for _, p in tree) == pytest.approx(sum(p for _, p in best))
        assert expected_tau(acc, size) == pytest.approx(1 + sum(p for _, p in best))


def test_greedy_tree_docstring_example():
    assert greedy_tree([[0.6, 0.2], [0.5, 0.1]], 3) == [((0,), 0.6), ((0, 0), 0.3), ((1,), 0.2)]
    assert tree_depth([[0.6, 0.2], [0.5, 0.1]], 3) == 2


def _curve(ms: dict[int, float]) -> CostCurve:
    return CostCurve(model_id="m", device="d", dtype="t", context=200, ms=ms)


CPU_MS = {
    1: 57,
    2: 94,
    3: 112,
    4: 84,
    5: 76,
    6: 81,
    7: 100,
    8: 88,
    10: 102,
    12: 88,
    16: 106,
    20: 98,
    24: 107,
    32: 137,
    40: 164,
    48: 180,
    64: 217,
}  # measured here (docs/performance.md)
GPU_MS = {k: 22.0 + 0.01 * k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256)}  # DESIGN.md: flat


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_flat_gpu_curve_picks_a_large_tree_cpu_curve_a_small_one(kind):
    acc = [[0.75, 0.1, 0.05, 0.03]] * 8
    gpu = tree_config(kind, acc, _curve(GPU_MS), step_cost=0.1)
    cpu = tree_config(kind, acc, _curve(CPU_MS), step_cost=0.1)
    size = "tree_size" if kind == "medusa" else "total_tokens"
    assert gpu[size] >= 32
    assert cpu[size] <= 16
    assert gpu[size] > 2 * cpu[size]
    if kind == "eagle":
        assert gpu["depth"] >= cpu["depth"]


def test_choose_tree_size_reference():
    acc = [[0.8, 0.1], [0.7, 0.1], [0.6]]

    def cost(k):
        return 1 + 0.2 * (k - 1)

    size, speed = choose_tree_size(acc, cost, max_size=6, draft_step_cost=0.1)
    ref = max(
        ((n, expected_tau(acc, n) / (cost(n + 1) + 0.1 * tree_depth(acc, n))) for n in range(1, 7)),
        key=lambda x: x[1],
    )
    assert (size, speed) == (ref[0], pytest.approx(ref[1]))


def test_expensive_drafting_can_mean_no_tree():
    size, speed = choose_tree_size([[0.1]], lambda k: 1.0 + k, draft_fixed_cost=1.0)
    assert (size, speed) == (0, 1.0)


def _select_reference(scores, parents, keep):
    """Greedy by score, skipping nodes whose ancestor closure would overflow `keep`."""
    chosen = []
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        need = []
        n = i
        while n >= 0 and n not in chosen:
            need.append(n)
            n = parents[n]
        if len(chosen) + len(need) <= keep:
            chosen += need
    return sorted(chosen)


@pytest.mark.parametrize("seed", range(10))
def test_select_nodes_matches_reference_and_is_closed(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 25)
    parents = [-1 if i == 0 or rng.random() < 0.3 else rng.randrange(i) for i in range(n)]
    scores = []
    for i in range(n):  # cumulative log-probs: a child never beats its parent
        scores.append((scores[parents[i]] if parents[i] >= 0 else 0.0) - rng.random() * 2)
    keep = rng.randint(1, n)
    got = select_nodes(scores, parents, keep)
    assert got == _select_reference(scores, parents, keep)
    assert len(got) == keep
    assert all(parents[i] in got or parents[i] == -1 for i in got)


def test_select_nodes_docstring_example():
    assert select_nodes([-0.1, -2.0, -0.3, -0.5], [-1, -1, 0, 2], 3) == [0, 2, 3]
