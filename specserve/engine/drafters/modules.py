"""The trainable drafter modules: Medusa-1 heads and the EAGLE draft layer (their specs: `specs`).

Both read the target's hidden features and reuse its frozen LM head (restricted to a draft
vocabulary: frequent tokens plus the request's prompt tokens); EAGLE also reuses the frozen
token embedding and instantiates one decoder layer of the target's own class.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from specserve.engine import hf_internals
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec
from specserve.engine.forward.head import head_product


class ResBlock(nn.Module):
    """Medusa-1 residual block h + SiLU(W h + b), W starting at zero (the head starts as the
    base LM head)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + nn.functional.silu(self.linear(h))


class MedusaHeads(nn.Module):
    def __init__(self, hidden: int, spec: MedusaSpec) -> None:
        super().__init__()
        self.spec = spec
        self.blocks = nn.ModuleList(ResBlock(hidden) for _ in range(spec.heads))
        self.head = (
            nn.Parameter(torch.zeros(spec.heads, spec.own_head, hidden)) if spec.own_head else None
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] (the target's final feature) -> [..., heads, H], each fed to the LM head."""
        return torch.stack([block(h) for block in self.blocks], dim=-2)

    def logits(
        self, h: torch.Tensor, shared_rows: torch.Tensor, column: bool = False
    ) -> torch.Tensor:
        """h [..., H] -> [..., heads, v]: over `shared_rows` [v, H] (the frozen LM head's rows
        of the request's draft vocabulary; `column`: as `head_product`), or over each head's
        own rows (v = own_head)."""
        out = self(h)  # [..., K, H]
        if self.head is None:
            flat = head_product(out.reshape(-1, out.shape[-1]), shared_rows, column)
            return flat.reshape(*out.shape[:-1], -1)
        return torch.einsum("...kh,kvh->...kv", out, self.head)


class EagleDraft(nn.Module):
    """u = fc([embed(token), feature]); h~ = DecoderLayer(u); logits = lm_head(h~).

    feature is the target's (fused) feature at committed positions and the draft's own h~ at
    drafted ones; h~ at position t predicts the target's final feature at t + 1.
    """

    def __init__(self, target, spec: EagleSpec) -> None:
        super().__init__()
        cfg = copy.deepcopy(target.config)
        cfg.num_hidden_layers = 1
        # the draft layer sees its whole past and tree (its own mask has no window)
        if getattr(cfg, "sliding_window", None) is not None:
            cfg.sliding_window = None
        if getattr(cfg, "layer_types", None) is not None:
            cfg.layer_types = ["full_attention"]
        hidden = cfg.hidden_size
        self.spec = spec
        n = len(spec.feature_layers)
        self.fuse = nn.Linear(n * hidden, hidden, bias=False) if n > 1 else None
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = hf_internals.decoder_layer(target, cfg, layer_idx=0)
        self.layer.to(target.dtype)

    def input_feature(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., layers, H] (target) -> [..., H] in the draft's feature space."""
        if self.fuse is None:
            return features[..., 0, :]
        return self.fuse(features.flatten(-2))

    def forward(
        self,
        embeds: torch.Tensor,  # [b, q, H] embeddings of the tokens following each feature
        feats: torch.Tensor,  # [b, q, H] draft-space features
        mask: torch.Tensor,  # [b, 1, q, past + q] additive
        position_ids: torch.Tensor,  # [b, q]
        target,
        cache=None,
    ) -> torch.Tensor:
        u = self.fc(torch.cat([embeds, feats], dim=-1))  # [b, q, H]
        rope = hf_internals.rotary(target, u, position_ids)
        return hf_internals.layer_forward(self.layer, u, mask, position_ids, cache, rope)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [..., q, k] -> additive float mask [..., q, k] (0 where allowed, dtype min where not)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)
