"""The LoRA-targetable projections of a causal LM, found from its modules, not listed: the names
of the Linear layers inside its decoder layers, split into the attention block's (fused
`qkv_proj`, `query_key_value` included) and the MLP's (fused `gate_up_proj` included).
"""

from __future__ import annotations

import re

import torch
from pydantic import BaseModel, ConfigDict

ATTENTION_BLOCK = re.compile(r"attn|attention", re.IGNORECASE)
NOT_DECODER = re.compile(r"vision|visual|image|audio|speech|encoder|embed", re.IGNORECASE)
# narrower Linears are routers and scalar gates (tiny models have <= 4 experts), not projections
MIN_OUT = 9


class Projections(BaseModel):
    """Module names (the last dotted component) a peft `target_modules` list takes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention: tuple[str, ...] = ()
    mlp: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        return self.attention + tuple(n for n in self.mlp if n not in self.attention)


def find_projections(model) -> Projections:
    """The projections of `model`'s decoder layers, in module order. Example: a Llama ->
    attention (q_proj, k_proj, v_proj, o_proj), mlp (gate_proj, up_proj, down_proj); a Phi-3 ->
    (qkv_proj, o_proj), (gate_up_proj, down_proj)."""
    attention: list[str] = []
    mlp: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module.out_features < MIN_OUT:
            continue
        parts = name.split(".")
        index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        if index is None or index + 2 > len(parts) or NOT_DECODER.search(name):
            continue  # the LM head, embeddings' projections, another tower's layers
        block, leaf = parts[index + 1 : -1], parts[-1]
        into = attention if any(ATTENTION_BLOCK.search(b) for b in block) else mlp
        if not block and ATTENTION_BLOCK.search(leaf):
            into = attention
        if leaf not in attention and leaf not in mlp:
            into.append(leaf)
    return Projections(attention=tuple(attention), mlp=tuple(mlp))
