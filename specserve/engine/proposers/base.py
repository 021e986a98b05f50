"""The proposer contract and the strategy registry.

A proposer holds one request's drafting state; it only proposes a `Draft` and observes what the
verifier committed. Strategies are looked up by name (`registry.Registry`); unknown names list
the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ValidationError

from specserve.engine.ngram_pool import NGramPool
from specserve.engine.registry import Registry
from specserve.engine.tree import Draft


@dataclass
class ProposerContext:
    """What a proposer may know about its request when it is built."""

    prompt_ids: list[int]
    vocab_size: int
    seed: int = 0
    pool: NGramPool | None = None  # shared n-gram pool (per variant@version), if any
    drafter: object | None = None  # trained drafter for this strategy (Medusa / EAGLE), if any


def trained_drafter(ctx: ProposerContext, spec_type: type, kind: str, label: str):
    """The context's trained drafter if it is of `spec_type`; else the error that says how to
    get one (`label`: the method's name in prose)."""
    drafter = ctx.drafter
    if drafter is None or not isinstance(drafter.spec, spec_type):
        raise ValueError(
            f"strategy '{kind}' needs a trained {label} drafter"
            f" for this model (specserve train-drafter --kind {kind}; pass its directory with"
            " --drafter-dir)"
        )
    return drafter


class Proposer(Protocol):
    """`feature_layers` (optional attribute, default none): the target hidden layers the
    proposer drafts from (see `hf_internals.hidden_features`). A proposer that names any also
    gets `observe_features` after every commit. `accepted_by_source` (optional attribute,
    source -> accepted draft tokens): where a proposer merging several sources says which
    source the accepted tokens came from."""

    def propose(self, tokens: list[int]) -> Draft:
        """Draft continuations of `tokens` (prompt + committed output; its last is the root)."""

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        """Learn from the step: the aux branch's argmax and the tokens now committed."""


class FeatureProposer(Proposer, Protocol):
    feature_layers: tuple[int, ...]

    def observe_features(self, features, tokens: list[int]) -> None:
        """features [m, layers, hidden]: the target's features at the last m committed
        positions before the new pending token, i.e. positions len(tokens) - 1 - m ..
        len(tokens) - 2; feature i was computed where tokens[len(tokens) - 1 - m + i] was the
        input and tokens[len(tokens) - m + i] is what came next. The prompt's features arrive
        after the first (prefill) step."""


@dataclass(frozen=True)
class Strategy:
    name: str
    config_type: type[BaseModel]
    build: Callable[[BaseModel, ProposerContext], Proposer]
    # limit(config, k) -> a config drafting at most k tokens per step (k >= 1); None: drafts nothing
    limit: Callable[[BaseModel, int], BaseModel] | None = None
    # the drafter kind whose artifacts it drafts with (None: its own name, if a kind has it)
    drafter_kind: str | None = None
    drafter_optional: bool = False  # it also drafts without one (the drafter only adds)
    # (config or None, the drafter's device-sized tree config) -> this strategy's config;
    # None: the drafter's config is the strategy's
    with_drafter_tree: Callable[[BaseModel | dict | None, dict], dict] | None = None

    @property
    def drafts_with(self) -> str:
        return self.drafter_kind or self.name


class UnknownStrategyError(ValueError):
    pass


class StrategyRegistry(Registry[Strategy]):
    """Name -> Strategy. One instance (`REGISTRY`) holds the built-in strategies."""

    def __init__(self) -> None:
        super().__init__("strategy", "strategies", UnknownStrategyError)

    def limited(self, name: str, config: BaseModel, max_draft_tokens: int) -> BaseModel:
        """`config` cut to draft at most `max_draft_tokens` (>= 1) per step (load shedding)."""
        strategy = self.get(name)
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, not {max_draft_tokens}")
        return strategy.limit(config, max_draft_tokens) if strategy.limit else config

    def config(self, name: str, config: BaseModel | dict | None = None) -> BaseModel:
        """Validate a config for strategy `name` (unknown fields fail, naming them)."""
        strategy = self.get(name)
        if isinstance(config, strategy.config_type):
            return config
        try:
            return strategy.config_type.model_validate(config or {})
        except ValidationError as err:
            raise ValueError(f"strategy {name!r} config: {err}") from None


REGISTRY = StrategyRegistry()
