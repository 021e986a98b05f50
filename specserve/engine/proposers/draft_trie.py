"""The hybrid proposer's merged candidates: a trie of draft tokens from every source, each node
with its best score (log probability that verification accepts it) and the source that gave it.
"""

from __future__ import annotations

from specserve.engine.tree import DraftTree


class DraftTrie:
    """Node (parent, token) -> index; parents are always added before their children.

    Example: add_chain([5, 6], [-0.1, -0.2], "prompt") then add(-1, 5, -0.05, "eagle"): two
    nodes, 5 (score -0.05, "eagle") and its child 6 (score -0.3, "prompt").
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.owners: list[str] = []
        self._index: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, score: float, owner: str) -> int:
        node = self._index.get((parent, token))
        if node is None:
            node = self._index[(parent, token)] = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
            self.scores.append(score)
            self.owners.append(owner)
        elif score > self.scores[node]:
            self.scores[node], self.owners[node] = score, owner
        return node

    def add_chain(self, chain: list[int], log_rates: list[float], owner: str) -> None:
        parent, score = -1, 0.0
        for token, log_rate in zip(chain, log_rates):
            score += log_rate
            parent = self.add(parent, token, score, owner)


def tree_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Every node's token path from the root. Example: tokens (5, 6, 8), parents (-1, 0, -1)
    -> {(5,), (5, 6), (8,)}."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tree.tokens, tree.parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return set(paths)
