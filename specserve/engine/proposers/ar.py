"""`ar`: plain autoregressive decoding, an empty draft every step (τ = 1)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy
from specserve.engine.tree import Draft


class ARConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ARProposer:
    def propose(self, tokens: list[int]) -> Draft:
        return Draft()

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        pass


def _build(config: ARConfig, ctx: ProposerContext) -> ARProposer:
    return ARProposer()


AR = REGISTRY.register(Strategy("ar", ARConfig, _build))
