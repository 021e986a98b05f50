"""`medusa` (Cai et al. 2024, Medusa-1): K heads on the target's last feature draft the tokens
2..K+1 positions ahead; each head's top candidates fill a static tree built from the heads'
measured accuracies (the paper's greedy construction), sized by the caller to the device.
The strategy and its drafter kind (module, tree budget) are both declared here.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.cost import CostCurve
from specserve.engine.drafters.modules import MedusaHeads
from specserve.engine.drafters.specs import MedusaSpec
from specserve.engine.drafters.trees import choose_tree_size, greedy_tree
from specserve.engine.drafters.vocab import head_rows, request_vocab
from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy
from specserve.engine.proposers.kinds import DRAFTER_KINDS, DrafterKind
from specserve.engine.tree import Draft, DraftTree


class MedusaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tree_size: int = Field(8, ge=1, description="draft nodes of the static tree")
    accept_rates: list[list[float]] | None = Field(
        None, description="acc[head][rank] for the tree; default: the drafter's held-out rates"
    )


def static_tree_paths(acc: list[list[float]], size: int, heads: int, topk: int):
    """The greedy tree's paths restricted to the drafter's heads and candidates per head."""
    acc = [row[:topk] for row in acc[:heads]]
    return [path for path, _ in greedy_tree(acc, size)]


class MedusaProposer:
    feature_layers = (-1,)

    def __init__(self, config: MedusaConfig, ctx: ProposerContext) -> None:
        drafter = ctx.drafter
        if drafter is None or not isinstance(drafter.spec, MedusaSpec):
            raise ValueError(
                "strategy 'medusa' needs a trained Medusa drafter for this model "
                "(specserve train-drafter --kind medusa; pass its directory with --drafter-dir)"
            )
        self.drafter = drafter  # the trained drafter (the service prices its draft levels)
        self.heads = drafter.module
        spec = drafter.spec
        acc = config.accept_rates or drafter.manifest.accept_rates
        self.paths = static_tree_paths(acc, config.tree_size, spec.heads, spec.topk)
        own = spec.own_head > 0  # own heads score just their trained vocabulary
        prompt = [] if own else ctx.prompt_ids
        self.vocab = request_vocab(drafter.draft_vocab, prompt, ctx.vocab_size)
        self.rows = head_rows(drafter.target, self.vocab)  # [v, H]
        self.topk = max((max(p) for p in self.paths), default=0) + 1
        self.candidates: list[list[int]] | None = None  # [heads][topk] token ids

    def propose(self, tokens: list[int]) -> Draft:
        if self.candidates is None or not self.paths:
            return Draft()
        index: dict[tuple[int, ...], int] = {}
        ids, parents = [], []
        for path in self.paths:
            if path[-1] >= len(self.candidates[len(path) - 1]) or (
                len(path) > 1 and path[:-1] not in index
            ):
                continue  # fewer candidates than ranks (a tiny draft vocabulary)
            index[path] = len(ids)
            ids.append(self.candidates[len(path) - 1][path[-1]])
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
        return Draft(DraftTree(tuple(ids), tuple(parents)))

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        pass

    @torch.inference_mode()
    def observe_features(self, features: torch.Tensor, tokens: list[int]) -> None:
        last = features[-1, 0].to(self.rows.dtype)  # [H]: the feature that produced the root
        logits = self.heads.logits(last, self.rows)  # [heads, v]
        top = logits.topk(min(self.topk, logits.shape[-1]), dim=-1).indices  # [heads, topk]
        self.candidates = self.vocab[top].tolist()


def _build(config: MedusaConfig, ctx: ProposerContext) -> MedusaProposer:
    return MedusaProposer(config, ctx)


MEDUSA = REGISTRY.register(Strategy("medusa", MedusaConfig, _build))


def _heads(target, spec: MedusaSpec) -> MedusaHeads:
    return MedusaHeads(target.config.hidden_size, spec)


def _draft_level(drafter, rows: torch.Tensor, nodes: int) -> torch.Tensor:
    """All heads and the LM head for one feature (the heads draft every depth at once)."""
    feature = torch.zeros(drafter.target.config.hidden_size, device=rows.device, dtype=rows.dtype)
    return drafter.module(feature) @ rows.T


def _tree_config(acc: list[list[float]], curve: CostCurve, step_cost: float, max_size: int) -> dict:
    """The static tree's size; the heads cost `step_cost` once per step, whatever the tree."""
    size, speed = choose_tree_size(acc, curve.relative, max_size, draft_fixed_cost=step_cost)
    return {"tree_size": max(size, 1), "predicted_speedup": round(speed, 3)}


MEDUSA_KIND = DRAFTER_KINDS.register(
    DrafterKind(MedusaSpec, _heads, _draft_level, _tree_config, level_per_depth=False)
)
