"""Proposers: each turns request state into a `Draft`; importing this package registers them (the
trained-drafter strategies draft with the kinds of `drafters.kinds`)."""

from specserve.engine.proposers import (  # noqa: F401
    ar,
    eagle,
    hybrid,
    lookahead,
    medusa,
    prompt_lookup,
)
from specserve.engine.proposers.base import (
    REGISTRY,
    FeatureProposer,
    Proposer,
    ProposerContext,
    Strategy,
)

__all__ = [
    "REGISTRY",
    "FeatureProposer",
    "Proposer",
    "ProposerContext",
    "Strategy",
]
