"""`draft_budget`: how many of a merged draft's best nodes to verify, by worked examples."""

from __future__ import annotations

from specserve.engine.proposers.draft_budget import chain_prefix, keep_count, step_cost


def test_keep_count_worked_example():
    costs = {1: 1.0, 2: 1.1, 3: 1.3, 4: 1.9}
    assert keep_count([0.9, 0.5, 0.1], 8, 0, costs) == 2
    assert keep_count([0.9, 0.5, 0.1], 1, 0, costs) == 1  # the budget caps it
    assert keep_count([0.9, 0.5, 0.1], 8, 0, {}) == 3  # no curve: the budget (or all there is)
    assert keep_count([0.01], 8, 0, {1: 1.0, 2: 1.5}) == 0  # not worth a row


def test_keep_count_prices_a_branching_draft_as_a_tree():
    """Docstring example: the first node is a chain, the second branches; at tree costs
    {3: 1.5, 4: 2.0} two nodes give 2.4 / 1.5 = 1.6 < 1.73 for one."""
    costs, trees = {1: 1.0, 2: 1.1, 3: 1.3, 4: 1.9}, {3: 1.5, 4: 2.0}
    assert keep_count([0.9, 0.5, 0.1], 8, 0, costs, chain_len=1, tree_cost=trees) == 1
    assert keep_count([0.9, 0.5, 0.1], 8, 0, costs, chain_len=3, tree_cost=trees) == 2  # a chain
    assert keep_count([0.9, 0.5, 0.1], 8, 0, costs, chain_len=1, tree_cost={}) == 2  # unpriced
    cheap = {3: 1.0, 4: 1.0}  # a tree never costs less than the chain of its width
    assert keep_count([0.9, 0.5, 0.1], 8, 0, costs, 1, cheap) == 2
    # window rows branch too: a chain of 2 nodes + 1 aux row is priced as a tree of 4
    costs, trees = {1: 1.0, 2: 1.0, 3: 1.1, 4: 1.2}, {2: 1.0, 3: 1.1, 4: 2.0}
    assert keep_count([0.9, 0.2], 8, 1, costs, chain_len=2, tree_cost=trees) == 1
    assert keep_count([0.9, 0.2], 8, 1, costs, chain_len=2, tree_cost={}) == 2


def test_chain_prefix_docstring_example():
    assert chain_prefix([0, 1, 3, 2], [-1, 0, 0, 1]) == 3
    assert chain_prefix([1, 0], [-1, -1]) == 1  # two roots: the second branches
    assert chain_prefix([], []) == 0


def test_keep_count_counts_the_window_rows():
    costs = {1: 1.0, 4: 1.0, 5: 2.0}
    assert keep_count([0.9], 4, 3, costs) == 0  # 1 + 3 window rows + 1 node = 5: too dear
    assert keep_count([0.9], 4, 2, costs) == 1


def test_keep_count_at_the_requests_rate():
    """The docstring's example: one node at 0.65 on costs {1: 1, 2: 1.6} pays by the step's
    own ratio (1.65 / 1.6) but not once the request reaches 1.2 tokens per unit of cost."""
    costs = {1: 1.0, 2: 1.6}
    assert keep_count([0.65], 4, 0, costs) == 1
    assert keep_count([0.65], 4, 0, costs, rate=1.0) == 1  # 0.05 > 0
    assert keep_count([0.65], 4, 0, costs, rate=1.2) == 0  # -0.27 < -0.2
    assert keep_count([0.95, 0.9], 4, 0, {1: 1.0, 2: 1.6, 3: 1.65}, rate=1.2) == 2


def test_step_cost_worked_example():
    costs, trees = {2: 1.1, 4: 1.9}, {4: 2.0}
    assert step_cost(3, 0, costs, 3, trees) == 1.9
    assert step_cost(3, 0, costs, 1, trees) == 2.0
    assert step_cost(1, 0, costs, 1, trees) == 1.1
