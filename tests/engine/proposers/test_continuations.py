"""Continuation counts and their path scores: the docstrings' worked examples, and both against
a slow reference that counts each path by scanning every occurrence."""

from __future__ import annotations

import math
import random

import pytest

from specserve.engine.proposers.continuations import (
    CountsConfig,
    continuation_counts,
    count_paths,
    path_log_scores,
)
from specserve.engine.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer


def test_worked_examples():
    tokens = [7, 1, 2, 7, 1, 3, 7]
    counts = continuation_counts(tokens, [1, 4], 2)
    assert counts == {(1,): 2, (1, 2): 1, (1, 3): 1}
    scores = path_log_scores(counts, 2, 1.0)
    assert scores[(1,)] == pytest.approx(math.log(2 / 3))
    assert scores[(1, 2)] == scores[(1, 3)] == pytest.approx(math.log(2 / 3 * 1 / 3))
    assert [CountsConfig(smoothing=2).alpha(n) for n in (1, 2, 3)] == [2.0, 1.0, 0.5]
    assert count_paths([(1, 2), (1, 3)]) == {(1,): 2, (1, 2): 1, (1, 3): 1}
    assert count_paths([(1, 2)], {(1,): 2, (1, 3): 1}) == {(1,): 3, (1, 2): 1, (1, 3): 1}


def test_prompt_lookup_starts_example():
    proposer = PromptLookupProposer(PromptLookupConfig(max_ngram=2, min_ngram=1))
    tokens = [7, 1, 2, 7, 1, 3, 7]
    assert proposer.starts(tokens, 1, 8) == [1, 4]
    assert proposer.starts(tokens, 1, 1) == [4]  # the most recent
    assert proposer.starts(tokens, 2, 8) == []  # (3, 7) occurs only at the end


def _slow_scores(tokens, n, recent, max_len, alpha):
    """Occurrences found by scanning; each path's count by comparing every continuation."""
    suffix = tokens[-n:]
    starts = [s + n for s in range(len(tokens) - n) if tokens[s : s + n] == suffix][-recent:]
    paths = {tuple(tokens[s : s + d]) for s in starts for d in range(1, max_len + 1)}

    def count(path):
        return sum(tokens[s : s + len(path)] == list(path) for s in starts)

    scores = {}
    for path in paths:
        score, parent = 0.0, len(starts)
        for d in range(1, len(path) + 1):
            c = count(path[:d])
            score += math.log(c / (parent + alpha))
            parent = c
        scores[path] = score
    return starts, scores


@pytest.mark.parametrize("seed", range(20))
def test_against_the_slow_reference(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(4) for _ in range(rng.randrange(5, 60))]
    n, recent, max_len = rng.randint(1, 3), rng.randint(1, 6), rng.randint(1, 5)
    cfg = CountsConfig(recent=recent, max_len=max_len, smoothing=rng.choice([0.5, 2.0]))
    proposer = PromptLookupProposer(PromptLookupConfig(max_ngram=3, min_ngram=1))
    starts = proposer.starts(tokens, n, recent)
    want_starts, want = _slow_scores(tokens, n, recent, max_len, cfg.alpha(n))
    assert starts == want_starts
    got = path_log_scores(continuation_counts(tokens, starts, max_len), len(starts), cfg.alpha(n))
    assert got.keys() == want.keys()
    for path, score in want.items():
        assert got[path] == pytest.approx(score)
