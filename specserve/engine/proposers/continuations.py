"""What followed the recent occurrences of a suffix: a trie of continuation paths, each scored by
an estimate of the chance that verification accepts it, the product along the path of
count(node) / (count(parent) + alpha). Pure functions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field


class CountsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recent: int = Field(32, ge=1, description="occurrences of a suffix counted (most recent)")
    max_len: int = Field(12, ge=1, description="tokens counted after each occurrence")
    recent_outputs: int = Field(
        32,
        ge=0,
        description="occurrences also counted in the variant's recent outputs (output_index.py; "
        "0: the request's own context alone)",
    )
    smoothing: float = Field(
        2.0,
        gt=0,
        description="alpha for a 1-token suffix, halved per further matched token: a longer "
        "match needs fewer occurrences to be trusted",
    )

    def alpha(self, n: int) -> float:
        """Example: smoothing 2 -> n=1: 2.0, n=2: 1.0, n=3: 0.5."""
        return self.smoothing * 2.0 ** (1 - n)


def continuation_counts(
    tokens: Sequence[int], starts: Sequence[int], max_len: int
) -> dict[tuple[int, ...], int]:
    """How many occurrences continue with each path of up to `max_len` tokens; `starts` holds
    the position right after each occurrence.

    Example: tokens [7, 1, 2, 7, 1, 3, 7], the suffix (7,) occurring before positions 1 and 4
    (the last 7 has no continuation yet), max_len 2 -> {(1,): 2, (1, 2): 1, (1, 3): 1}.
    """
    return count_paths(tuple(tokens[start : start + max_len]) for start in starts)


def count_paths(
    continuations: Iterable[tuple[int, ...]], counts: dict[tuple[int, ...], int] | None = None
) -> dict[tuple[int, ...], int]:
    """How many continuations start with each path (added to `counts` when given).
    Example: [(1, 2), (1, 3)] -> {(1,): 2, (1, 2): 1, (1, 3): 1}."""
    counts = {} if counts is None else counts
    for continuation in continuations:
        for depth in range(1, len(continuation) + 1):
            path = continuation[:depth]
            counts[path] = counts.get(path, 0) + 1
    return counts


def path_log_scores(
    counts: dict[tuple[int, ...], int], occurrences: int, alpha: float
) -> dict[tuple[int, ...], float]:
    """Per path, log of the product over its nodes of count(node) / (count(parent) + alpha),
    the root's count being the number of occurrences. Parents come before children.

    Example: counts {(1,): 2, (1, 2): 1, (1, 3): 1}, 2 occurrences, alpha 1 -> (1,): log(2/3),
    (1, 2) and (1, 3): log(2/3 * 1/3).
    """
    scores: dict[tuple[int, ...], float] = {}
    for path in sorted(counts, key=len):
        parent = path[:-1]
        parent_count = counts[parent] if parent else occurrences
        own = math.log(counts[path] / (parent_count + alpha))
        scores[path] = (scores[parent] if parent else 0.0) + own
    return scores
