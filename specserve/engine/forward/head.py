"""Verification logits in float32 for a low-precision model: the LM head computed from the
model's (bf16) hidden state with a float32 copy of its weights, so logits are not rounded to the
bf16 grid (1/8 at magnitude 16-32) before the argmax. Uses the public output-embedding API.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Float32Head(torch.nn.Module):
    """logits = x.float() @ W32^T (+ b32): [..., hidden] in any dtype -> [..., vocab] float32."""

    def __init__(self, head: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=False)
        bias = head.bias.detach().float() if head.bias is not None else None
        self.bias = torch.nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias)


def use_float32_head(model) -> bool:
    """Swap in a float32 LM head (once); False when the model already computes in float32."""
    head = model.get_output_embeddings()
    if isinstance(head, Float32Head) or head.weight.dtype == torch.float32:
        return False
    model.set_output_embeddings(Float32Head(head).to(head.weight.device))
    return True
