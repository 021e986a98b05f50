"""`medusa` (Cai et al. 2024, Medusa-1): K heads on the target's last feature draft the tokens
2..K+1 positions ahead; each head's top candidates fill a static tree built from the heads'
measured accuracies (the paper's greedy construction), sized by the caller to the device.
Its drafter kind (module, tree budget) is declared in `drafters.kinds`.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.drafters.specs import MedusaSpec
from specserve.engine.drafters.trees import greedy_tree
from specserve.engine.drafters.vocab import head_rows, request_vocab
from specserve.engine.forward.head import column_head
from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy, trained_drafter
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
        drafter = trained_drafter(ctx, MedusaSpec, "medusa", "Medusa")
        self.drafter = drafter  # the trained drafter (the service prices its draft levels)
        self.heads = drafter.module
        spec = drafter.spec
        acc = config.accept_rates or drafter.manifest.accept_rates
        self.paths = static_tree_paths(acc, config.tree_size, spec.heads, spec.topk)
        own = spec.own_head > 0  # own heads score just their trained vocabulary
        prompt = [] if own else ctx.prompt_ids
        self.vocab = request_vocab(drafter.draft_vocab, prompt, ctx.vocab_size)
        self.rows = head_rows(drafter.target, self.vocab)  # [v, H]
        self.column = column_head(drafter.target)  # the heads' product, as the target's
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
        logits = self.heads.logits(last, self.rows, self.column)  # [heads, v]
        top = logits.topk(min(self.topk, logits.shape[-1]), dim=-1).indices  # [heads, topk]
        self.candidates = self.vocab[top].tolist()


def _build(config: MedusaConfig, ctx: ProposerContext) -> MedusaProposer:
    return MedusaProposer(config, ctx)


MEDUSA = REGISTRY.register(Strategy("medusa", MedusaConfig, _build))
