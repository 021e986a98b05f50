"""Proposers: each turns request state into a `Draft`; importing this package registers them."""

from specserve.engine.proposers import ar, eagle, lookahead, medusa, prompt_lookup  # noqa: F401
from specserve.engine.proposers.base import (
    REGISTRY,
    FeatureProposer,
    Proposer,
    ProposerContext,
    Strategy,
)

__all__ = ["REGISTRY", "FeatureProposer", "Proposer", "ProposerContext", "Strategy"]
