"""`eagle` (Li et al. 2024, EAGLE-2 tree): one draft decoder layer drafts autoregressively in the
target's feature space; the dynamic tree expands the `topk` best nodes by cumulative draft
log-probability for `depth` levels, then keeps the best `total_tokens` nodes for verification.

The draft layer has its own KV cache over committed positions (computed from the target's
features, handed over after each commit); tree rows are appended while drafting and dropped after.
Its drafter kind (module, tree budget) is declared in `drafters.kinds`.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from specserve.engine import hf_internals
from specserve.engine.drafters.modules import additive_mask
from specserve.engine.drafters.specs import EagleSpec
from specserve.engine.drafters.trees import select_nodes
from specserve.engine.drafters.vocab import head_rows, request_vocab
from specserve.engine.forward.head import column_head, head_product
from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy, trained_drafter
from specserve.engine.tree import Draft, DraftTree


class EagleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    depth: int = Field(4, ge=1, description="d: draft levels")
    topk: int = Field(4, ge=1, description="k: nodes expanded per level, children per node")
    total_tokens: int = Field(8, ge=1, description="nodes kept for verification")


class EagleProposer:
    def __init__(self, config: EagleConfig, ctx: ProposerContext) -> None:
        drafter = trained_drafter(ctx, EagleSpec, "eagle", "EAGLE")
        self.config = config
        self.drafter = drafter  # the trained drafter (the service prices its draft levels)
        self.draft = drafter.module
        self.target = drafter.target
        self.feature_layers = tuple(drafter.spec.feature_layers)
        self.vocab = request_vocab(drafter.draft_vocab, ctx.prompt_ids, ctx.vocab_size)
        self.rows = head_rows(self.target, self.vocab)  # [v, H]
        self.column = column_head(self.target)  # the draft head's product, as the target's
        self.embed = self.target.get_input_embeddings()
        self.cache = hf_internals.empty_cache()
        self.committed = 0  # draft cache rows = committed positions with a known next token
        self.root_h: torch.Tensor | None = None  # [H] draft feature of the root position
        self.root_logp: torch.Tensor | None = None  # [v] draft log-probs of the root's children

    def _run(self, tokens: list[int], feats, allowed, positions: list[int]) -> torch.Tensor:
        """Draft layer over q rows; allowed [q, cache + q] bool. Returns h~ [q, H]."""
        dev = self.rows.device
        e = self.embed(torch.tensor([tokens], device=dev))  # [1, q, H]
        mask = additive_mask(allowed.to(dev), self.rows.dtype)[None, None]
        pos = torch.tensor([positions], device=dev)
        return self.draft(e, feats[None], mask, pos, self.target, self.cache)[0]

    def _logp(self, h: torch.Tensor) -> torch.Tensor:
        logits = head_product(h, self.rows, self.column)  # [q, v]
        return torch.log_softmax(logits.float(), dim=-1)

    @torch.inference_mode()
    def observe_features(self, features: torch.Tensor, tokens: list[int]) -> None:
        m = features.shape[0]
        start = len(tokens) - 1 - m  # position of the first feature
        if start != self.committed:
            raise RuntimeError(f"eagle: features start at {start}, draft cache at {self.committed}")
        g = self.draft.input_feature(features.to(self.rows.dtype))  # [m, H]
        allowed = torch.ones(m, start + m, dtype=torch.bool)
        allowed[:, start:] = torch.ones(m, m, dtype=torch.bool).tril()
        h = self._run(tokens[start + 1 :], g, allowed, list(range(start, start + m)))
        self.committed = start + m
        self.root_h = h[-1]
        self.root_logp = self._logp(h[-1:])[0]

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        pass

    @torch.inference_mode()
    def propose(self, tokens: list[int]) -> Draft:
        ids, parents, scores = self.candidates(tokens)
        keep = select_nodes(scores, parents, self.config.total_tokens)
        new_index = {old: new for new, old in enumerate(keep)}
        tree = DraftTree(
            tuple(ids[i] for i in keep),
            tuple(new_index[parents[i]] if parents[i] >= 0 else -1 for i in keep),
        )
        return Draft(tree)

    @torch.inference_mode()
    def candidates(self, tokens: list[int]) -> tuple[list[int], list[int], list[float]]:
        """The expanded tree before EAGLE-2's rerank: node tokens, parents (topological, -1 =
        the root) and cumulative draft log-probabilities; empty before the first features."""
        if self.root_logp is None:
            return [], [], []
        cfg = self.config
        k = min(cfg.topk, self.root_logp.shape[-1])
        root_pos = len(tokens) - 1
        # candidate nodes (creation order is topological)
        ids: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depth_of: list[int] = []
        source_h: list[torch.Tensor] = []  # draft feature that predicted the node
        row_of: dict[int, int] = {}  # expanded node -> its row in the draft cache
        top = self.root_logp.topk(k)
        for lp, j in zip(top.values.tolist(), top.indices.tolist()):
            ids.append(int(self.vocab[j]))
            parents.append(-1)
            scores.append(lp)
            depth_of.append(1)
            source_h.append(self.root_h)
        level = list(range(len(ids)))
        for depth in range(1, cfg.depth):
            expand = sorted(level, key=lambda i: -scores[i])[:k]
            base = self.committed + len(row_of)
            q = len(expand)
            allowed = torch.zeros(q, base + q, dtype=torch.bool)
            allowed[:, : self.committed] = True
            for r, node in enumerate(expand):
                anc = parents[node]
                while anc >= 0:
                    allowed[r, row_of[anc]] = True
                    anc = parents[anc]
                allowed[r, base + r] = True
            for r, node in enumerate(expand):
                row_of[node] = base + r
            feats = torch.stack([source_h[i] for i in expand])  # [q, H]
            positions = [root_pos + depth - 1] * q
            h = self._run([ids[i] for i in expand], feats, allowed, positions)  # [q, H]
            logp = self._logp(h)  # [q, v]
            best = logp.topk(k, dim=-1)
            level = []
            for r, node in enumerate(expand):
                for lp, j in zip(best.values[r].tolist(), best.indices[r].tolist()):
                    level.append(len(ids))
                    ids.append(int(self.vocab[j]))
                    parents.append(node)
                    scores.append(scores[node] + lp)
                    depth_of.append(depth + 1)
                    source_h.append(h[r])
        hf_internals.keep_rows(self.cache, self.committed, [])
        return ids, parents, scores


def _build(config: EagleConfig, ctx: ProposerContext) -> EagleProposer:
    return EagleProposer(config, ctx)


EAGLE = REGISTRY.register(Strategy("eagle", EagleConfig, _build))
