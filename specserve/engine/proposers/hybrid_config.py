"""`HybridConfig`: what the hybrid proposer (hybrid.py) merges, under which budget and how it
scores and prices its nodes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.proposers.continuations import CountsConfig
from specserve.engine.proposers.eagle import EagleConfig
from specserve.engine.proposers.lookahead import LookaheadConfig
from specserve.engine.proposers.prompt_lookup import PromptLookupConfig
from specserve.engine.proposers.source_gate import GateConfig


class HybridConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budget: int = Field(12, ge=0, description="most draft tokens verified per step")
    relative_cost: dict[int, float] = Field(
        {},
        description="verify cost per width relative to one row (the device cost curve); when "
        "set, each step keeps the node count (<= budget) maximizing expected tokens - r x cost "
        "(`rate_aware`) or expected tokens / cost",
    )
    relative_tree_cost: dict[int, float] = Field(
        {},
        description="the same for a tree of that width (the invariant forward gathers a tree's "
        "keys: dearer than a chain); a step whose kept nodes branch is priced by it",
    )
    prompt: PromptLookupConfig = PromptLookupConfig(
        max_ngram=3, min_ngram=1, draft_len=8, max_matches=4
    )
    counts: CountsConfig | None = Field(
        CountsConfig(),
        description="score the context's continuations by how often each followed the matched "
        "suffix (None: prompt matches scored by their measured acceptance per match length)",
    )
    pool_guesses: int = Field(4, ge=0, description="pool continuations considered per step")
    pool_prior: tuple[float, float] = Field(
        (1.0, 9.0),
        description="Beta prior of a pool token's acceptance until measured: a fresh pool holds "
        "the prompt's own n-grams, which the continuation counts already score",
    )
    pool_draft_len: int = Field(6, ge=1, description="pool chains extended by lookups to this")
    window: LookaheadConfig | None = Field(
        LookaheadConfig(window=2, ngram=3, guesses=0),
        description="the Lookahead window that feeds the pool (None: the pool is fed by "
        "prompt and output n-grams only)",
    )
    eagle: EagleConfig = EagleConfig(depth=5, topk=4, total_tokens=1)
    use_drafter: bool = Field(True, description="draft with EAGLE when the variant has one")
    gate: GateConfig = Field(
        GateConfig(),
        description="EAGLE and the window's rows run only on steps they pay for (source_gate.py)",
    )
    rate_aware: bool = Field(
        True,
        description="keep the nodes maximizing expected tokens - r x cost, r the tokens per "
        "unit of cost this request reaches so far, instead of the step's own ratio (which "
        "over-drafts once a request beats plain decoding)",
    )
    calibrate: bool = Field(
        True,
        description="scale each node's score by how often verified nodes of its source and "
        "score were accepted, measured per variant (node_calibration.py): on a steep cost curve "
        "an over-confident score buys rows that do not pay",
    )
