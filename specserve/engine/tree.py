"""Draft trees: the tokens a proposer wants verified, as a trie under the root token.

A chain is a tree with one branch. Nodes are in topological order (parent before child);
parent -1 means the root, i.e. the last committed token whose logits the verify forward computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens and their parents; `draft_probs[i]` is the distribution node i was drawn
    from (None: every node was chosen deterministically, a point mass on its token)."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    draft_probs: torch.Tensor | None = None  # [n, vocab]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}; parents must come before children")

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def from_chains(chains: list[list[int]]) -> DraftTree:
        """Merge token chains into a trie; shared prefixes share nodes.

        >>> t = DraftTree.from_chains([[5, 6, 7], [5, 8], [9]])
        >>> t.tokens, t.parents
        ((5, 6, 7, 8, 9), (-1, 0, 1, 0, -1))
        """
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for chain in chains:
            parent = -1
            for token in chain:
                node = index.get((parent, token))
                if node is None:
                    node = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                    index[(parent, token)] = node
                parent = node
        return DraftTree(tuple(tokens), tuple(parents))

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node; children of the root have depth 1."""
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        return tuple(depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[0] lists the root's children; children[i + 1] those of node i."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return tuple(tuple(k) for k in kids)

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: mask[i, j] is True when node j is node i or one of its ancestors."""
        n = len(self)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask


@dataclass(frozen=True)
class AuxBranch:
    """Extra tokens scored in the same forward but never committed (Lookahead's Jacobi window).

    Each token sits at position root + offsets[i], attends to the committed context, the root and
    the aux tokens marked in `visible`; the forward returns argmax tokens at `logit_rows`.
    """

    tokens: tuple[int, ...]
    offsets: tuple[int, ...]
    visible: torch.Tensor  # [a, a] bool
    logit_rows: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Draft:
    """What a proposer hands the verifier: the tree to verify and an optional aux branch."""

    tree: DraftTree = field(default_factory=DraftTree)
    aux: AuxBranch | None = None


def draft_width(draft: Draft) -> int:
    """Query rows a draft adds to the verify forward: its tree nodes plus its aux branch."""
    return len(draft.tree) + (len(draft.aux) if draft.aux else 0)


def cap_draft(draft: Draft, max_tokens: int) -> Draft:
    """The draft cut to at most `max_tokens` rows (load shedding); still lossless to verify.

    Tree nodes come first, in topological order (a prefix keeps every kept node's parent);
    the aux branch stays only if all of it fits in the room left, else it is dropped (it is never
    committed). Example: tree of 5 nodes + aux of 4, max 6 -> first 5 nodes, no aux; max 3 ->
    nodes 0..2, no aux; max 9 -> unchanged.
    """
    if draft_width(draft) <= max_tokens:
        return draft
    tree = draft.tree
    keep = max(0, min(len(tree), max_tokens))
    probs = tree.draft_probs[:keep] if tree.draft_probs is not None else None
    cut = DraftTree(tree.tokens[:keep], tree.parents[:keep], probs)
    aux = draft.aux if draft.aux and len(draft.aux) <= max_tokens - keep else None
    return Draft(cut, aux)


def cap_depth(draft: Draft, depth: int) -> Draft:
    """The draft without tree nodes deeper than `depth` (their ancestors all stay) and without
    its aux branch if any aux token sits more than `depth` past the root; still lossless.
    Example: a chain of 5 nodes, depth 3 -> its first 3 nodes."""
    tree, aux = draft.tree, draft.aux
    keep = [i for i, d in enumerate(tree.depths) if d <= depth]
    if len(keep) < len(tree):
        index = {old: new for new, old in enumerate(keep)}
        parents = tuple(-1 if tree.parents[i] < 0 else index[tree.parents[i]] for i in keep)
        probs = tree.draft_probs[keep] if tree.draft_probs is not None else None
        tree = DraftTree(tuple(tree.tokens[i] for i in keep), parents, probs)
    if aux is not None and max(aux.offsets, default=0) > depth:
        aux = None
    return Draft(tree, aux)
