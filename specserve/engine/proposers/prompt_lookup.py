"""`prompt_lookup`: draft the continuation of earlier occurrences of the last n tokens.

Searches prompt and generated text (longest n first, most recent match first); several distinct
continuations become branches of one tree. The draft length adapts: +2 after a draft is accepted
whole, -1 after a miss, between `draft_len` and `max_draft_len`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy
from specserve.engine.tree import Draft, DraftTree


class PromptLookupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_ngram: int = Field(3, ge=1, description="longest suffix to match")
    min_ngram: int = Field(1, ge=1, description="shortest suffix to match")
    draft_len: int = Field(6, ge=1, description="tokens drafted per match (the floor)")
    max_draft_len: int = Field(0, ge=0, description="adaptive ceiling; 0 keeps draft_len fixed")
    max_matches: int = Field(2, ge=1, description="distinct continuations (tree branches)")

    @model_validator(mode="after")
    def _check_order(self) -> PromptLookupConfig:
        if self.min_ngram > self.max_ngram:
            raise ValueError("min_ngram must not exceed max_ngram")
        if self.max_draft_len and self.max_draft_len < self.draft_len:
            raise ValueError("max_draft_len must be 0 or at least draft_len")
        return self


class PromptLookupProposer:
    """Keeps an index n-gram -> positions right after it, updated as tokens are committed."""

    def __init__(self, config: PromptLookupConfig) -> None:
        self.config = config
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # tokens[: _indexed] are in the index
        self.draft_len = config.draft_len  # current, adaptive length
        self._proposed_at = 0  # len(tokens) when the last draft was made

    def _extend_index(self, tokens: list[int]) -> None:
        lo, hi = self.config.min_ngram, self.config.max_ngram
        for end in range(self._indexed, len(tokens)):
            for n in range(lo, min(hi, end + 1) + 1):
                self._index.setdefault(tuple(tokens[end - n + 1 : end + 1]), []).append(end + 1)
        self._indexed = len(tokens)

    def matches(self, tokens: list[int], limit: int) -> list[tuple[int, list[int]]]:
        """Up to `limit` distinct continuations of earlier occurrences of the last tokens, each
        with the length n of the suffix it matched (longest n first, most recent first)."""
        self._extend_index(tokens)
        self._proposed_at = len(tokens)
        cfg = self.config
        found: list[tuple[int, list[int]]] = []
        for n in range(min(cfg.max_ngram, len(tokens)), cfg.min_ngram - 1, -1):
            for start in reversed(self._index.get(tuple(tokens[-n:]), [])):
                chain = tokens[start : start + self.draft_len]
                if chain and all(chain != c for _, c in found):
                    found.append((n, chain))
                if len(found) == limit:
                    return found
        return found

    def starts(self, tokens: list[int], n: int, recent: int) -> list[int]:
        """Where the continuations of the last `recent` earlier occurrences of the last n tokens
        begin (oldest first). Example: tokens [7, 1, 2, 7, 1, 3, 7], n 1 -> [1, 4]."""
        self._extend_index(tokens)
        found = self._index.get(tuple(tokens[-n:]), [])
        return [s for s in found[-recent - 1 :] if s < len(tokens)][-recent:]

    def propose(self, tokens: list[int]) -> Draft:
        chains = [chain for _, chain in self.matches(tokens, self.config.max_matches)]
        return Draft(DraftTree.from_chains(chains))

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        """Adapt the draft length; the index catches up lazily in propose."""
        if not draft.tree or not self.config.max_draft_len:
            return
        accepted = len(tokens) - self._proposed_at - 1  # committed minus the bonus token
        if accepted >= max(draft.tree.depths):
            self.draft_len = min(self.draft_len + 2, self.config.max_draft_len)
        else:
            self.draft_len = max(self.draft_len - 1, self.config.draft_len)


def _build(config: PromptLookupConfig, ctx: ProposerContext) -> PromptLookupProposer:
    return PromptLookupProposer(config)


def limit(config: PromptLookupConfig, k: int) -> PromptLookupConfig:
    """At most k tokens per step: max_matches * longest draft <= k.

    Example: draft_len 6, max_matches 2 (12 tokens) with k=4 -> draft_len 4, max_matches 1.
    """
    longest = min(max(config.draft_len, config.max_draft_len), k)
    draft_len = min(config.draft_len, longest)
    max_draft_len = longest if config.max_draft_len else 0
    matches = max(1, min(config.max_matches, k // longest))
    update = {"draft_len": draft_len, "max_draft_len": max_draft_len, "max_matches": matches}
    return config.model_copy(update=update)


PROMPT_LOOKUP = REGISTRY.register(Strategy("prompt_lookup", PromptLookupConfig, _build, limit))
