from __future__ import annotations

import random

import pytest

from specserve.engine.proposers import REGISTRY, ProposerContext
from specserve.engine.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer
from specserve.engine.tree import DraftTree


def _propose(tokens, **cfg):
    return PromptLookupProposer(PromptLookupConfig(**cfg)).propose(list(tokens))


def _chains(tree: DraftTree) -> list[list[int]]:
    """Root-to-leaf token chains of a tree, in node order of the leaves."""
    paths = []
    for i, p in enumerate(tree.parents):
        paths.append((paths[p] if p >= 0 else []) + [tree.tokens[i]])
    leaves = [i for i in range(len(tree)) if not tree.children[i + 1]]
    return [paths[i] for i in leaves]


def test_most_recent_continuation_first():
    tokens = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
    draft = _propose(tokens, max_ngram=2, min_ngram=1, draft_len=6, max_matches=2)
    # (1, 2) occurs ending at 1 and 5 (and at the end, with nothing after it)
    assert draft.tree == DraftTree.from_chains([[5, 6, 1, 2], [3, 4, 1, 2, 5, 6]])
    assert draft.aux is None
    one = _propose(tokens, max_ngram=2, draft_len=6, max_matches=1)
    assert _chains(one.tree) == [[5, 6, 1, 2]]


def test_longest_ngram_first():
    tokens = [9, 1, 2, 7, 5, 2, 8, 9, 1, 2]
    # (9, 1, 2) -> 7 wins over the more recent single-token match (2,) -> 8
    draft = _propose(tokens, max_ngram=3, min_ngram=1, draft_len=3, max_matches=1)
    assert _chains(draft.tree) == [[7, 5, 2]]
    # with room for more, the shorter match adds a branch; duplicates are not repeated
    draft = _propose(tokens, max_ngram=3, min_ngram=1, draft_len=3, max_matches=5)
    assert _chains(draft.tree) == [[7, 5, 2], [8, 9, 1]]
    # min_ngram 2 rules out the single-token match
    draft = _propose(tokens, max_ngram=3, min_ngram=2, draft_len=3, max_matches=5)
    assert _chains(draft.tree) == [[7, 5, 2]]


def test_draft_len_and_end_of_sequence():
    tokens = [4, 5, 6, 7, 8, 4]
    assert _chains(_propose(tokens, draft_len=2).tree) == [[5, 6]]
    assert _chains(_propose(tokens, draft_len=10).tree) == [[5, 6, 7, 8, 4]]
    tokens = [3, 4, 3]  # the continuation runs into the suffix itself
    assert _chains(_propose(tokens, draft_len=5).tree) == [[4, 3]]


def test_shared_prefix_branches_merge_into_a_trie():
    tokens = [1, 7, 8, 9, 1, 7, 8, 5, 1]
    draft = _propose(tokens, max_ngram=1, draft_len=3, max_matches=3)
    assert draft.tree.tokens == (7, 8, 5, 9)
    assert draft.tree.parents == (-1, 0, 1, 1)


def test_no_match_gives_empty_draft():
    assert len(_propose([1, 2, 3, 4]).tree) == 0
    assert len(_propose([5]).tree) == 0
    assert len(_propose([5, 5], min_ngram=2, max_ngram=3).tree) == 0
    assert _chains(_propose([5, 5]).tree) == [[5]]


@pytest.mark.parametrize("seed", range(8))
def test_incremental_index_equals_fresh(seed):
    """The lazily extended index gives what a proposer built on the full sequence gives."""
    rng = random.Random(seed)
    cfg = PromptLookupConfig(
        max_ngram=rng.randrange(1, 5),
        min_ngram=1,
        draft_len=rng.randrange(1, 7),
        max_matches=rng.randrange(1, 4),
    )
    tokens = [rng.randrange(4) for _ in range(10)]
    live = PromptLookupProposer(cfg)
    for _ in range(15):
        assert live.propose(tokens).tree == PromptLookupProposer(cfg).propose(tokens).tree
        tokens += [rng.randrange(4) for _ in range(rng.randrange(1, 4))]


def test_brute_force_reference_on_random_sequences():
    rng = random.Random(0)
    for _ in range(200):
        cfg = PromptLookupConfig(max_ngram=3, min_ngram=1, draft_len=4, max_matches=3)
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 25))]
        chains: list[list[int]] = []
        for n in range(min(3, len(tokens)), 0, -1):
            suffix = tokens[-n:]
            for end in range(len(tokens) - 1, n - 2, -1):  # most recent first
                if tokens[end - n + 1 : end + 1] == suffix:
                    chain = tokens[end + 1 : end + 5]
                    if chain and chain not in chains and len(chains) < 3:
                        chains.append(chain)
        assert PromptLookupProposer(cfg).propose(tokens).tree == DraftTree.from_chains(chains)


def test_registry_and_config_validation():
    cfg = REGISTRY.config("prompt_lookup", {"max_ngram": 4})
    assert isinstance(cfg, PromptLookupConfig) and cfg.max_ngram == 4
    proposer = REGISTRY.get("prompt_lookup").build(cfg, ProposerContext([1, 2], 10))
    assert len(proposer.propose([1, 2, 1]).tree) > 0
    with pytest.raises(ValueError, match="min_ngram"):
        REGISTRY.config("prompt_lookup", {"min_ngram": 3, "max_ngram": 2})
    with pytest.raises(ValueError, match="draft_len"):
        REGISTRY.config("prompt_lookup", {"draft_len": 0})
    with pytest.raises(ValueError, match="nonsense"):
        REGISTRY.config("prompt_lookup", {"nonsense": 1})


def test_adaptive_draft_length_grows_on_full_acceptance_and_shrinks_on_miss():
    tokens = list(range(40)) + list(range(10))  # the suffix repeats the start: long matches
    proposer = PromptLookupProposer(
        PromptLookupConfig(min_ngram=2, draft_len=3, max_draft_len=8, max_matches=1)
    )
    draft = proposer.propose(tokens)
    assert max(draft.tree.depths) == 3
    tokens += list(range(10, 14))  # all 3 drafted tokens accepted + bonus
    proposer.observe(draft, [], tokens)
    assert proposer.draft_len == 5
    draft = proposer.propose(tokens)
    assert max(draft.tree.depths) == 5
    tokens += list(range(14, 20))
    proposer.observe(draft, [], tokens)
    assert proposer.draft_len == 7
    tokens += [20]  # nothing accepted: only the bonus token
    proposer.observe(proposer.propose(tokens[:-1]), [], tokens)
    assert proposer.draft_len == 6
    for _ in range(10):
        tokens += [999]
        proposer.observe(proposer.propose(tokens[:-1]), [], tokens)
    assert proposer.draft_len >= 3  # never below the floor


def test_fixed_draft_length_without_ceiling():
    proposer = PromptLookupProposer(PromptLookupConfig(draft_len=3))
    tokens = list(range(20)) + list(range(5))
    draft = proposer.propose(tokens)
    proposer.observe(draft, [], tokens + [5, 6, 7, 8])
    assert proposer.draft_len == 3


def test_ceiling_below_floor_is_rejected():
    with pytest.raises(ValueError, match="max_draft_len"):
        PromptLookupConfig(draft_len=5, max_draft_len=3)
