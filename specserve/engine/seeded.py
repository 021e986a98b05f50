"""Reproducible sampling that stays lossless: the token at absolute position t is the inverse CDF
of p_t at one uniform u(seed, t), keyed by (seed, position) alone, so a sample never depends on
how many random numbers earlier steps drew (draft lengths, load caps, pools, batch mates).
Verification then accepts a drafted token iff it equals that sample at its node, exactly like
greedy; each committed token is ~ p_t because u is uniform.
"""

from __future__ import annotations

import torch

from specserve.engine.tree import DraftTree
from specserve.engine.verify import greedy_accept

_MASK = (1 << 64) - 1


def mix(seed: int, position: int) -> int:
    """A 64-bit stream key for (seed, position): splitmix64's finalizer over both, so nearby
    seeds and positions give unrelated streams.

    Example: mix(0, 0) == 0x8209B480FAED1B10; mix(0, 1) differs from it in about half its bits.
    """
    x = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xD1B54A32D192ED03) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """u(seed, position) in [0, 1): the top 53 bits of `mix`, a pure function of both.

    Example: uniform(0, 0) == (0x8209B480FAED1B10 >> 11) / 2**53 ≈ 0.50796.
    """
    return (mix(seed, position) >> 11) / float(1 << 53)


def seeded_tokens(probs: torch.Tensor, seed: int, positions: list[int]) -> list[int]:
    """The sampled token of each row: the first token whose cumulative probability exceeds
    u(seed, positions[i]) (tokens in id order; a zero-probability token is never chosen).

    probs: [rows, vocab] (the processed target distribution).
    Example: probs [[0.2, 0.0, 0.8]] gives [0] where u < 0.2, else [2]; never 1.
    """
    cdf = torch.cumsum(probs.double().cpu(), dim=-1)  # [rows, vocab], sequential: deterministic
    u = torch.tensor([[uniform(seed, p)] for p in positions], dtype=torch.float64)  # [rows, 1]
    picked = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [rows, 1]
    return picked.clamp(max=probs.shape[-1] - 1).squeeze(-1).tolist()


def node_positions(tree: DraftTree, next_position: int) -> list[int]:
    """Absolute position each verify row predicts: the root row the next token's
    (`next_position`, i.e. len(tokens)), node i's row the one after it (next + depth).

    Example: a chain of 2 nodes after 10 tokens: [10, 11, 12].
    """
    return [next_position, *(next_position + d for d in tree.depths)]


def seeded_accept(
    tree: DraftTree, target_probs: torch.Tensor, seed: int, next_position: int
) -> tuple[list[int], int]:
    """Accepted nodes and bonus under seeded sampling: greedy acceptance against each row's
    seeded sample, so the committed tokens are those `ar` with this seed would commit.

    Example: a chain [4] after 7 tokens, where the sample at position 7 is 4 and at position 8
    is 9: returns ([0], 9). target_probs: [n + 1, vocab].
    """
    targets = seeded_tokens(target_probs, seed, node_positions(tree, next_position))
    return greedy_accept(tree, targets)
