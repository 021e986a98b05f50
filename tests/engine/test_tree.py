from __future__ import annotations

import random

import pytest
import torch

from specserve.engine.tree import AuxBranch, Draft, DraftTree, cap_depth, cap_draft, draft_width


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


# --- draft_width / cap_draft (load shedding) ---------------------------------------------------


def _aux(n: int) -> AuxBranch:
    return AuxBranch(
        tuple(range(100, 100 + n)),
        tuple(range(1, n + 1)),
        torch.eye(n, dtype=torch.bool),
        (n - 1,),
    )


def _tree(n: int, seed: int = 0, vocab: int = 7, probs: bool = True) -> DraftTree:
    rng = random.Random(seed)
    parents = tuple(rng.randrange(-1, i) for i in range(n))
    p = torch.rand(n, vocab, generator=torch.Generator().manual_seed(seed)) if probs else None
    return DraftTree(tuple(rng.randrange(vocab) for _ in range(n)), parents, p)


def test_draft_width_counts_tree_nodes_and_aux():
    """draft_width = tree nodes + aux tokens (0 for an empty draft)."""
    assert draft_width(Draft()) == 0
    assert draft_width(Draft(_tree(5))) == 5
    assert draft_width(Draft(_tree(5), _aux(4))) == 9
    assert draft_width(Draft(DraftTree(), _aux(3))) == 3


def test_cap_draft_docstring_example():
    """Tree of 5 + aux of 4: max 6 -> first 5 nodes, no aux; max 3 -> nodes 0..2; max 9 -> same."""
    tree = DraftTree.from_chains([[5, 6, 7], [5, 8], [9, 1]])
    assert len(tree) == 6
    tree = DraftTree(tree.tokens[:5], tree.parents[:5], torch.rand(5, 10))
    draft = Draft(tree, _aux(4))

    six = cap_draft(draft, 6)
    assert six.tree.tokens == tree.tokens and six.tree.parents == tree.parents
    assert six.aux is None
    assert draft_width(six) == 5

    three = cap_draft(draft, 3)
    assert three.tree.tokens == (5, 6, 7) and three.tree.parents == (-1, 0, 1)
    assert torch.equal(three.tree.draft_probs, tree.draft_probs[:3])
    assert three.aux is None

    assert cap_draft(draft, 9) is draft
    assert cap_draft(draft, 50) is draft


def test_cap_draft_returns_the_same_object_when_it_fits():
    """A draft no wider than the cap comes back untouched (identity, not a copy)."""
    for draft in (Draft(), Draft(_tree(4)), Draft(_tree(3), _aux(2)), Draft(DraftTree(), _aux(2))):
        w = draft_width(draft)
        assert cap_draft(draft, w) is draft
        assert cap_draft(draft, w + 1) is draft
        if w:
            assert cap_draft(draft, w - 1) is not draft


def test_cap_draft_keeps_aux_only_when_all_of_it_fits_after_the_tree():
    """The aux branch is all or nothing; it never displaces tree nodes."""
    draft = Draft(_tree(3), _aux(2))
    assert cap_draft(draft, 5).aux is draft.aux
    cut = cap_draft(draft, 4)
    assert len(cut.tree) == 3 and cut.aux is None  # 1 slot left, aux needs 2
    cut = cap_draft(draft, 2)
    assert len(cut.tree) == 2 and cut.aux is None
    only_aux = Draft(DraftTree(), _aux(3))
    assert cap_draft(only_aux, 3) is only_aux
    cut = cap_draft(only_aux, 2)
    assert len(cut.tree) == 0 and cut.aux is None


def test_cap_draft_zero_gives_an_empty_tree_and_no_aux():
    """Cap 0 turns speculation off: no nodes, no aux, an empty [0, vocab] probs block."""
    draft = Draft(_tree(4, vocab=11), _aux(3))
    cut = cap_draft(draft, 0)
    assert len(cut.tree) == 0 and cut.tree.parents == ()
    assert cut.aux is None
    assert cut.tree.draft_probs.shape == (0, 11)
    assert draft_width(cut) == 0
    plain = cap_draft(Draft(_tree(4, probs=False)), 0)
    assert len(plain.tree) == 0 and plain.tree.draft_probs is None
    assert len(draft.tree) == 4 and len(draft.aux) == 3  # the input is not modified


@pytest.mark.parametrize("seed", range(20))
def test_cap_draft_random_is_a_valid_prefix_with_aligned_probs(seed):
    """Any cap: width <= cap, the tree is a topological prefix (parents before children, same
    depths), draft_probs rows stay aligned with their nodes, aux kept iff it wholly fits."""
    rng = random.Random(1000 + seed)
    n = rng.randrange(0, 14)
    tree = _tree(n, seed=seed, probs=rng.random() < 0.8)
    a = rng.choice([0, rng.randrange(1, 6)])
    draft = Draft(tree, _aux(a) if a else None)
    for cap in range(n + a + 2):
        cut = cap_draft(draft, cap)
        keep = min(n, cap)
        assert draft_width(cut) <= cap
        assert len(cut.tree) == keep
        assert cut.tree.tokens == tree.tokens[:keep]
        assert cut.tree.parents == tree.parents[:keep]
        assert all(-1 <= p < i for i, p in enumerate(cut.tree.parents))
        assert cut.tree.depths == tree.depths[:keep]
        if tree.draft_probs is None:
            assert cut.tree.draft_probs is None
        else:
            assert cut.tree.draft_probs.shape == (keep, tree.draft_probs.shape[1])
            for i in range(keep):
                assert torch.equal(cut.tree.draft_probs[i], tree.draft_probs[i])
        fits = a > 0 and a <= cap - keep
        assert (cut.aux is draft.aux) if fits else (cut.aux is None)
        assert (cut is draft) == (n + a <= cap)


def test_cap_depth_drops_deeper_nodes_and_far_aux():
    tree = DraftTree.from_chains([[1, 2, 3, 4], [1, 5], [6, 7, 8]])
    capped = cap_depth(Draft(tree), 2)
    assert capped.tree.tokens == (1, 2, 5, 6, 7)
    assert capped.tree.parents == (-1, 0, 0, -1, 3)
    aux = AuxBranch((9, 9), (1, 3), torch.ones(2, 2, dtype=torch.bool), (0, 1))
    assert cap_depth(Draft(tree, aux), 2).aux is None
    assert cap_depth(Draft(tree, aux), 3).aux is aux
