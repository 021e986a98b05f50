from __future__ import annotations

import pytest
import torch

from specserve.engine.ngram_pool import NGramPool
from specserve.engine.proposers import REGISTRY, ProposerContext
from specserve.engine.proposers.lookahead import (
    LookaheadConfig,
    LookaheadProposer,
    window_layout,
)
from specserve.engine.tree import DraftTree


def test_window_layout_docstring_example():
    offsets, visible = window_layout(2, 2)
    assert offsets == [1, 2, 2, 3]
    # rows/cols: (0,0) (0,1) (1,0) (1,1)
    assert visible.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("levels", [1, 2, 4])
def test_window_layout_rows_see_a_contiguous_guess(window, levels):
    offsets, visible = window_layout(window, levels)
    assert len(offsets) == window * levels
    assert visible.shape == (window * levels, window * levels) and visible.dtype == torch.bool
    for lvl in range(levels):
        for col in range(window):
            row = lvl * window + col
            assert offsets[row] == 1 + col + lvl
            seen = sorted(offsets[j] for j in range(len(offsets)) if visible[row, j])
            assert seen == list(range(1, offsets[row] + 1))  # one token per earlier position
            assert visible[row, row]


def _proposer(prompt, seed=0, pool=None, **cfg):
    return LookaheadProposer(LookaheadConfig(**cfg), ProposerContext(list(prompt), 50, seed, pool))


def _chains(tree):
    paths = []
    for i, p in enumerate(tree.parents):
        paths.append((paths[p] if p >= 0 else []) + [tree.tokens[i]])
    return [paths[i] for i in range(len(tree)) if not tree.children[i + 1]]


def test_pool_seeded_from_prompt_and_drafts_keyed_by_last_token():
    prompt = [1, 2, 3, 1, 2, 4, 1]
    prop = _proposer(prompt, window=2, ngram=3, guesses=2)
    assert prop.pool.get((1,), 5) == [(2, 4), (2, 3)]
    assert prop.pool.get((2,), 5) == [(4, 1), (3, 1)]
    draft = prop.propose(prompt)
    assert draft.tree == DraftTree.from_chains([[2, 4], [2, 3]])
    assert _chains(draft.tree) == [[2, 4], [2, 3]]
    # guesses caps the number of n-grams
    assert _chains(_proposer(prompt, ngram=3, guesses=1).propose(prompt).tree) == [[2, 4]]
    assert len(_proposer(prompt, ngram=3, guesses=0).propose(prompt).tree) == 0
    # no seeding: nothing to draft yet
    assert len(_proposer(prompt, seed_from_prompt=False).propose(prompt).tree) == 0


def test_key_len_two():
    prompt = [1, 2, 3, 9, 1, 2, 5, 9, 1, 2]
    prop = _proposer(prompt, ngram=4, key_len=2, guesses=5)
    assert _chains(prop.propose(prompt).tree) == [[5, 9], [3, 9]]
    with pytest.raises(ValueError, match="key_len"):
        _proposer(prompt, ngram=2, key_len=2)


def test_aux_branch_shape_and_initial_window_from_prompt():
    prompt = [11, 12, 13, 14]
    prop = _proposer(prompt, seed=5, window=3, ngram=4)
    draft = prop.propose(prompt)
    aux = draft.aux
    assert len(aux) == 3  # one level of W guesses to start
    assert set(aux.tokens) <= set(prompt)
    assert aux.offsets == (1, 2, 3)
    assert aux.logit_rows == (0, 1, 2)
    # the initial guesses depend only on the seed
    assert _proposer(prompt, seed=5, window=3, ngram=4).propose(prompt).aux.tokens == aux.tokens
    assert _proposer([7], seed=1, window=4).propose([7]).aux.tokens == (7, 7, 7, 7)


def test_levels_grow_to_n_minus_1_then_pool_gets_ngrams():
    prompt = [1, 2]
    prop = _proposer(
        prompt, window=2, ngram=4, guesses=3, seed_from_prompt=False, feed_output=False
    )
    level0 = list(prop.levels[0])
    tokens = list(prompt)
    steps = [[30, 31], [32, 33], [34, 35], [36, 37]]

    d = prop.propose(tokens)
    prop.observe(d, steps[0], tokens)
    assert prop.levels == [level0, steps[0]] and len(prop.pool) == 0
    d = prop.propose(tokens)
    assert d.aux.tokens == tuple(level0 + steps[0])
    assert d.aux.logit_rows == (2, 3)  # the top level
    assert list(d.aux.offsets) == window_layout(2, 2)[0]
    prop.observe(d, steps[1], tokens)
    assert prop.levels == [level0, steps[0], steps[1]] and len(prop.pool) == 0  # N - 1 = 3
    d = prop.propose(tokens)
    assert d.aux.logit_rows == (4, 5)
    prop.observe(d, steps[2], tokens)
    # every column became an N-gram: column j = (level0[j], 30+j, 32+j, 34+j)
    assert prop.levels == [steps[0], steps[1], steps[2]]
    entries = {(k, c) for k, conts in prop.pool.items() for c in conts}
    assert entries == {((level0[0],), (30, 32, 34)), ((level0[1],), (31, 33, 35))}
    prop.observe(prop.propose(tokens), steps[3], tokens)
    assert prop.pool.get((30,), 5) == [(32, 34, 36)]
    assert prop.pool.get((31,), 5) == [(33, 35, 37)]
    assert prop.levels == [steps[1], steps[2], steps[3]]
    # the window's n-grams now drive drafts keyed by the last committed token
    assert _chains(prop.propose([1, 30]).tree) == [[32, 34, 36]]


def test_ngram_two_uses_a_single_level():
    prop = _proposer([5], window=3, ngram=2, seed_from_prompt=False, feed_output=False)
    first = list(prop.levels[0])
    prop.observe(prop.propose([5]), [7, 8, 9], [5])
    assert prop.levels == [[7, 8, 9]]
    assert {prop.pool.get((t,), 5)[0] for t in set(first)} <= {(7,), (8,), (9,)}


def test_feed_output_adds_ngrams_of_committed_tokens_once():
    prompt = [7, 1, 2, 3]
    # ngram 4: the window (N - 1 = 3 levels) adds nothing during the first two steps
    prop = _proposer(prompt, window=1, ngram=4, seed_from_prompt=False)
    tokens = prompt + [4, 5]
    prop.observe(prop.propose(prompt), [0], tokens)
    # only n-grams containing a new token: (1, 2, 3, 4), (2, 3, 4, 5); not the prompt's own
    assert prop.pool.items() == [((1,), [(2, 3, 4)]), ((2,), [(3, 4, 5)])]
    tokens += [6]
    prop.observe(prop.propose(tokens), [0], tokens)
    assert prop.pool.items() == [((1,), [(2, 3, 4)]), ((2,), [(3, 4, 5)]), ((3,), [(4, 5, 6)])]
    off = _proposer(prompt, window=1, ngram=4, seed_from_prompt=False, feed_output=False)
    off.observe(off.propose(prompt), [0], prompt + [4, 5])
    assert len(off.pool) == 0


def test_shared_pool_is_used_and_filled():
    pool = NGramPool()
    pool.add((9,), (8, 7))
    prop = _proposer([1, 2, 3, 9], pool=pool, ngram=3)
    assert prop.pool is pool
    assert _chains(prop.propose([1, 2, 3, 9]).tree) == [[8, 7]]
    assert pool.get((1,), 5) == [(2, 3)]  # seeded from this prompt


def test_empty_shared_pool_is_used():
    pool = NGramPool()
    prop = _proposer([1, 2, 3, 9], pool=pool, ngram=3)
    assert prop.pool is pool
    assert pool.get((1,), 5) == [(2, 3)]


def test_registry_config_validation():
    assert REGISTRY.config("lookahead", None) == LookaheadConfig()
    for bad in [{"window": 0}, {"ngram": 1}, {"guesses": -1}, {"unknown_knob": 3}]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            REGISTRY.config("lookahead", bad)
