"""`lookahead` (Fu et al. 2024): a Jacobi lookahead branch and an n-gram verification branch
scored in the same forward.

The window holds N-1 levels of W guesses. Token (level l, column j) sits at root + 1 + j + l and
attends to level 0 columns 0..j and levels 1..l of column j: a contiguous guessed context, so its
argmax guesses the next position. Each step the top level's argmax becomes a new level, the oldest
level drops, and every column yields an N-gram for the pool. Drafts are up to G pool entries keyed
by the root token, merged into a trie. The pool is also seeded from the prompt and fed by output.
"""

from __future__ import annotations

import random

import torch
from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.ngram_pool import NGramPool
from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy
from specserve.engine.tree import AuxBranch, Draft, DraftTree


class LookaheadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    window: int = Field(4, ge=1, description="W: Jacobi window width")
    ngram: int = Field(3, ge=2, description="N: n-gram size (N-1 window levels, N-1 draft tokens)")
    guesses: int = Field(2, ge=0, description="G: candidate n-grams verified per step")
    key_len: int = Field(1, ge=1, description="tokens of context that key the pool")
    seed_from_prompt: bool = True
    feed_output: bool = Field(True, description="add n-grams of committed output to the pool")
    pool_max_keys: int = Field(65536, ge=1)
    pool_max_per_key: int = Field(8, ge=1)


def window_layout(window: int, levels: int) -> tuple[list[int], torch.Tensor]:
    """Offsets from the root and the [a, a] visibility of a window of `levels` x `window` tokens,
    flattened level-major.

    Example: window 2, levels 2 -> tokens (0,0) (0,1) (1,0) (1,1) at offsets [1, 2, 2, 3];
    (1,1) sees (0,0), (0,1) and itself; (1,0) sees (0,0) and itself.
    """
    a = window * levels
    visible = torch.zeros(a, a, dtype=torch.bool)
    offsets = []
    for lvl in range(levels):
        for col in range(window):
            row = lvl * window + col
            offsets.append(1 + col + lvl)
            visible[row, : col + 1] = True  # level 0, columns 0..col
            for up in range(1, lvl + 1):
                visible[row, up * window + col] = True  # levels 1..lvl of this column
    return offsets, visible


class LookaheadProposer:
    def __init__(self, config: LookaheadConfig, ctx: ProposerContext) -> None:
        self.config = config
        self.pool = (
            ctx.pool
            if ctx.pool is not None
            else NGramPool(config.pool_max_keys, config.pool_max_per_key)
        )
        self._cont_len = config.ngram - config.key_len
        if self._cont_len < 1:
            raise ValueError("lookahead: ngram must exceed key_len")
        if config.seed_from_prompt:
            self.pool.add_ngrams(ctx.prompt_ids, config.key_len, self._cont_len)
        self._fed = len(ctx.prompt_ids)  # tokens already fed to the pool
        rng = random.Random(ctx.seed)
        source = ctx.prompt_ids or [0]
        self.levels: list[list[int]] = [[rng.choice(source) for _ in range(config.window)]]
        self._layouts: dict[int, tuple[list[int], torch.Tensor]] = {}

    def propose(self, tokens: list[int]) -> Draft:
        cfg = self.config
        chains = []
        if cfg.guesses and len(tokens) >= cfg.key_len:
            key = tokens[-cfg.key_len :]
            chains = [list(c) for c in self.pool.get(key, cfg.guesses)]
        levels = len(self.levels)
        if levels not in self._layouts:
            self._layouts[levels] = window_layout(cfg.window, levels)
        offsets, visible = self._layouts[levels]
        top = (levels - 1) * cfg.window
        aux = AuxBranch(
            tokens=tuple(t for level in self.levels for t in level),
            offsets=tuple(offsets),
            visible=visible,
            logit_rows=tuple(range(top, top + cfg.window)),
        )
        return Draft(DraftTree.from_chains(chains), aux)

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        cfg = self.config
        if draft.aux is None:  # the engine cut the window off this step (load): keep the levels
            self._feed(tokens)
            return
        if len(self.levels) == cfg.ngram - 1:
            for col in range(cfg.window):
                gram = [level[col] for level in self.levels] + [aux_tokens[col]]
                self.pool.add(gram[: cfg.key_len], gram[cfg.key_len :])
            self.levels = self.levels[1:]
        self.levels.append(list(aux_tokens))
        self._feed(tokens)

    def _feed(self, tokens: list[int]) -> None:
        """Add the n-grams of newly committed output to the pool."""
        cfg = self.config
        if cfg.feed_output:
            start = max(self._fed - cfg.ngram + 1, 0)
            self.pool.add_ngrams(tokens, cfg.key_len, self._cont_len, start=start)
            self._fed = len(tokens)


def _build(config: LookaheadConfig, ctx: ProposerContext) -> LookaheadProposer:
    return LookaheadProposer(config, ctx)


def limit(config: LookaheadConfig, k: int) -> LookaheadConfig:
    """At most k tokens per step: (window + guesses) * (ngram - 1) <= k; guesses go first.

    Example: W4 N3 G2 (12 tokens) with k=6 -> W3 N3 G0; with k=1 -> W1 N2 G0.
    """
    ngram = min(config.ngram, k + 1)
    levels = ngram - 1
    window = min(config.window, k // levels)
    guesses = min(config.guesses, k // levels - window)
    return config.model_copy(update={"ngram": ngram, "window": window, "guesses": guesses})


LOOKAHEAD = REGISTRY.register(Strategy("lookahead", LookaheadConfig, _build, limit))
