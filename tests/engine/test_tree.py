from __future__ import annotations

import random

import pytest
import torch

from specserve.engine.tree import AuxBranch, Draft, DraftTree


def test_from_chains_docstring_example():
    t = DraftTree.from_chains([[5, 6, 7], [5, 8], [9]])
    assert t.tokens == (5, 6, 7, 8, 9)
    assert t.parents == (-1, 0, 1, 0, -1)
    assert t.depths == (1, 2, 3, 2, 1)
    assert t.children == ((0, 4), (1, 3), (2,), (), (), ())
    assert t.draft_probs is None


def test_from_chains_merges_shared_prefixes_only():
    t = DraftTree.from_chains([[1, 2, 3], [1, 2, 3], [1, 2, 4], [2, 2], [1, 3, 3]])
    # identical chains add nothing; same token under different parents stays distinct
    assert t.tokens == (1, 2, 3, 4, 2, 2, 3, 3)
    assert t.parents == (-1, 0, 1, 1, -1, 4, 0, 6)
    assert len(t) == 8


def test_from_chains_empty_and_empty_chains():
    assert len(DraftTree.from_chains([])) == 0
    assert len(DraftTree.from_chains([[], []])) == 0
    t = DraftTree()
    assert t.depths == () and t.children == ((),)
    assert t.ancestor_mask().shape == (0, 0)
    assert len(Draft().tree) == 0 and Draft().aux is None


def _paths(chains):
    """Every distinct prefix of every chain (the nodes the trie must hold)."""
    return {tuple(c[:k]) for c in chains for k in range(1, len(c) + 1)}


@pytest.mark.parametrize("seed", range(30))
def test_from_chains_random_is_a_trie_of_the_chains(seed):
    rng = random.Random(seed)
    chains = [
        [rng.randrange(4) for _ in range(rng.randrange(0, 6))] for _ in range(rng.randrange(1, 8))
    ]
    t = DraftTree.from_chains(chains)

    def path(i):
        out = []
        while i >= 0:
            out.append(t.tokens[i])
            i = t.parents[i]
        return tuple(reversed(out))

    node_paths = [path(i) for i in range(len(t))]
    assert len(set(node_paths)) == len(t)  # no duplicate nodes
    assert set(node_paths) == _paths(chains)
    for i, p in enumerate(t.parents):
        assert -1 <= p < i
        assert t.depths[i] == len(node_paths[i])
    # children: consistent with parents, sibling tokens distinct, every node listed once
    listed = [c for kids in t.children for c in kids]
    assert sorted(listed) == list(range(len(t)))
    for slot, kids in enumerate(t.children):
        assert all(t.parents[c] == slot - 1 for c in kids)
        assert len({t.tokens[c] for c in kids}) == len(kids)
        assert list(kids) == sorted(kids)


def test_ancestor_mask():
    t = DraftTree.from_chains([[5, 6, 7], [5, 8], [9]])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 0, 0, 1, 0],
            [0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    mask = t.ancestor_mask()
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("seed", range(10))
def test_ancestor_mask_random(seed):
    rng = random.Random(seed)
    n = rng.randrange(1, 15)
    parents = tuple(rng.randrange(-1, i) for i in range(n))
    t = DraftTree(tuple(range(n)), parents)
    mask = t.ancestor_mask()
    for i in range(n):
        anc = set()
        j = i
        while j >= 0:
            anc.add(j)
            j = parents[j]
        assert {j for j in range(n) if mask[i, j]} == anc
        assert mask[i].sum().item() == t.depths[i]


@pytest.mark.parametrize(
    "tokens, parents",
    [
        ((1,), (0,)),  # a node cannot be its own parent
        ((1, 2), (-1, 1)),
        ((1, 2), (1, -1)),  # parent after child
        ((1,), (-2,)),
        ((1, 2, 3), (-1, 0, 5)),
    ],
)
def test_invalid_parents_rejected(tokens, parents):
    with pytest.raises(ValueError, match="parent"):
        DraftTree(tokens, parents)


def test_length_mismatch_rejected():
    with pytest.raises(ValueError, match="same length"):
        DraftTree((1, 2), (-1,))


def test_aux_branch_len():
    aux = AuxBranch(
        tokens=(1, 2, 3), offsets=(1, 2, 3), visible=torch.eye(3, dtype=torch.bool), logit_rows=(2,)
    )
    assert len(aux) == 3
