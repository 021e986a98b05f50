"""How many of a merged draft's nodes to verify: the count maximizing expected tokens per unit of
verify cost on the device's cost curves (chains and trees priced apart). Pure functions."""

from __future__ import annotations


def keep_count(
    probs: list[float],
    budget: int,
    aux: int,
    relative_cost: dict[int, float],
    chain_len: int | None = None,
    tree_cost: dict[int, float] | None = None,
    rate: float | None = None,
) -> int:
    """How many of the best nodes (acceptance probabilities `probs`, best first) to verify.

    Without a cost curve, `budget`. With one, the k <= budget maximizing (1 + sum of the first k)
    / cost(1 + aux + k), where the first `chain_len` nodes form a chain (None: all do) and a
    draft that branches (k > chain_len) or carries aux rows costs `tree_cost` (where given).
    Example: probs [0.9, 0.5, 0.1], costs {1: 1, 2: 1.1, 3: 1.3, 4: 1.9}: k 0..3 give 1.0,
    1.73, 1.85, 1.05 -> 2; with chain_len 1 and tree costs {3: 1.5, 4: 2.0}, k = 2 gives
    2.4 / 1.5 = 1.6 and k = 1 wins (1.73).

    With `rate` (the tokens per unit cost the request reaches), the k maximizing expected - rate
    x cost: the step that raises the whole request's tokens / cost, where the per-step ratio
    over-drafts once the request beats 1 (Dinkelbach). Example: probs [0.65], costs {1: 1, 2:
    1.6}: the ratio keeps it (1.65 / 1.6 > 1); at rate 1.2, 1.65 - 1.92 < 1 - 1.2 -> 0.
    """
    k_max = min(budget, len(probs))
    if not relative_cost:
        return k_max
    chain_len = k_max if chain_len is None else chain_len
    best_k, best = 0, 0.0
    expected = 1.0
    for k in range(k_max + 1):
        if k:
            expected += probs[k - 1]
        cost = step_cost(k, aux, relative_cost, chain_len, tree_cost)
        speed = expected / cost if rate is None else expected - rate * cost
        if k == 0 or speed > best:
            best_k, best = k, speed
    return best_k


def step_cost(
    k: int,
    aux: int,
    relative_cost: dict[int, float],
    chain_len: int,
    tree_cost: dict[int, float] | None = None,
) -> float:
    """The verify cost of the root, `aux` rows and k nodes of which the first `chain_len` form a
    chain; a tree (k > chain_len, or aux rows) never costs less than the chain. Example: costs
    {2: 1.1, 4: 1.9}, trees {4: 2.0}: k 3, chain_len 3 -> 1.9; chain_len 1 -> 2.0."""
    cost = relative_at(relative_cost, 1 + aux + k)
    if tree_cost and (k > chain_len or aux > 0):
        cost = max(cost, relative_at(tree_cost, 1 + aux + k))
    return cost


def relative_at(cost: dict[int, float], width: int) -> float:
    """The cheapest measured width that fits (padding is free); linear past the largest."""
    fits = [cost[w] for w in cost if w >= width]
    if fits:
        return min(fits)
    largest = max(cost)
    return cost[largest] * width / largest


def chain_prefix(order: list[int], parents: list[int]) -> int:
    """How many of the nodes `order` lists (best first) form a chain from the root, each the
    child of the one before. Example: parents [-1, 0, 0, 1], order [0, 1, 3, 2] -> 3."""
    n = 0
    for node in order:
        if parents[node] != (order[n - 1] if n else -1):
            break
        n += 1
    return n
