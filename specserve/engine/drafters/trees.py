"""Pure tree arithmetic for trained drafters: Medusa's static tree from measured accuracies,
the expected τ of a tree, the device-priced choice of tree size, and EAGLE-2's node selection.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

Path = tuple[int, ...]  # candidate ranks along a path from the root: (r1, r2, ...)


def greedy_tree(acc: Sequence[Sequence[float]], size: int) -> list[tuple[Path, float]]:
    """The `size` paths with the highest acceptance probability, best first (Medusa's greedy
    construction). acc[d][r]: probability that the rank-r candidate at depth d + 1 is the right
    token (given its parent was); a path's probability is the product along it. Parents are
    always chosen before their children (a child's probability never exceeds its parent's).

    Example: acc [[0.6, 0.2], [0.5, 0.1]], size 3 -> [((0,), 0.6), ((0, 0), 0.3), ((1,), 0.2)].
    """
    out: list[tuple[Path, float]] = []
    frontier: list[tuple[float, Path]] = []  # (-probability, path): a max-heap

    def push_children(path: Path, prob: float) -> None:
        if len(path) < len(acc):
            for rank, a in enumerate(acc[len(path)]):
                heapq.heappush(frontier, (-prob * a, path + (rank,)))

    push_children((), 1.0)
    while frontier and len(out) < size:
        neg, path = heapq.heappop(frontier)
        out.append((path, -neg))
        push_children(path, -neg)
    return out


def expected_tau(acc: Sequence[Sequence[float]], size: int) -> float:
    """Expected tokens per forward of the best `size`-node tree: 1 (the bonus) + the sum of its
    path probabilities. Example: acc [[0.6, 0.2], [0.5, 0.1]], size 3 -> 1 + 0.6 + 0.3 + 0.2."""
    return 1.0 + sum(p for _, p in greedy_tree(acc, size))


def tree_depth(acc: Sequence[Sequence[float]], size: int) -> int:
    """Depth of the best `size`-node tree (0 for an empty tree)."""
    return max((len(p) for p, _ in greedy_tree(acc, size)), default=0)


def choose_tree_size(
    acc: Sequence[Sequence[float]],
    relative_cost: Callable[[int], float],
    max_size: int = 64,
    draft_step_cost: float = 0.0,
    draft_fixed_cost: float = 0.0,
) -> tuple[int, float]:
    """(size, predicted speedup over plain decoding) maximizing expected τ / step cost.

    A step verifies 1 + size tokens, costing relative_cost(1 + size) (the device curve,
    relative to a 1-token forward), plus draft_step_cost per draft depth (the drafter's own
    forward, relative to the same) and draft_fixed_cost once per step. Example: acc [[0.8]*4]*8 with a flat (GPU-like) curve
    picks a large tree; with cost 1 + 0.1 * k it picks a small one.
    """
    best = (0, 1.0)
    for size in range(1, max_size + 1):
        depth = tree_depth(acc, size)
        cost = relative_cost(1 + size) + draft_step_cost * depth + draft_fixed_cost
        speed = expected_tau(acc, size) / cost
        if speed > best[1] + 1e-12:
            best = (size, speed)
    return best


def select_nodes(scores: Sequence[float], parents: Sequence[int], keep: int) -> list[int]:
    """EAGLE-2's rerank: the `keep` nodes with the highest cumulative log-probability, closed
    under ancestors, in the original (topological) order. parents[i] < i or -1.

    Example: scores [-0.1, -2.0, -0.3, -0.5], parents [-1, -1, 0, 2], keep 3 -> [0, 2, 3].
    """
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen: set[int] = set()
    for i in order:
        if len(chosen) >= keep:
            break
        chain = []
        node = i
        while node >= 0 and node not in chosen:
            chain.append(node)
            node = parents[node]
        if len(chosen) + len(chain) <= keep:
            chosen.update(chain)
    return sorted(chosen)
