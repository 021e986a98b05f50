"""Proposers: each turns request state into a `Draft`; importing this package registers them and
the drafter kinds (`DRAFTER_KINDS`) that the trained-drafter strategies draft with."""

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
from specserve.engine.proposers.kinds import DRAFTER_KINDS, DrafterKind

__all__ = [
    "DRAFTER_KINDS",
    "REGISTRY",
    "DrafterKind",
    "FeatureProposer",
    "Proposer",
    "ProposerContext",
    "Strategy",
]
