"""The LM head as served (`install_head`): optionally in float32 over a low-precision model, so
logits are not rounded to the bf16 grid (1/8 at magnitude 16-32) before the argmax; and, where
measured faster here, products of several rows computed as (W @ x^T)^T. Public HF API only.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

COLUMN_GAIN = 1.25  # the column product is used where it is at least this much faster


class LmHead(torch.nn.Linear):
    """logits = x @ W^T (+ b): [..., hidden] in any dtype -> [..., vocab] in W's dtype.

    `column`: a product of two or more rows runs as (W @ x^T)^T (an sgemm with no transposed
    operand). On an AVX2 Zen 3 MKL's 2-8-row `F.linear` over SmolLM2's 49,152 x 576 float32
    head costs 23-26 ms against 8-13 ms this way (10 ms for one row either way). A subclass of
    `nn.Linear`, so the invariance probe and row tiles treat it as one (tiles replace its
    forward: row-invariant products only)."""

    def __init__(self, weight: torch.nn.Parameter, bias, column: bool = False) -> None:
        torch.nn.Module.__init__(self)  # no fresh weights: it holds the model's (or a copy)
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias
        self.column = column

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.weight.dtype)
        if not self.column:
            return F.linear(x, self.weight, self.bias)
        out = head_product(x.reshape(-1, x.shape[-1]), self.weight, column=True)  # [M, vocab]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def head_product(x: torch.Tensor, weight: torch.Tensor, column: bool) -> torch.Tensor:
    """x [M, H] @ weight [V, H]^T -> [M, V]; as (weight @ x^T)^T when `column` and M >= 2.

    Example: x [[1, 2]], weight [[1, 0], [0, 1], [1, 1]] -> [[1, 2, 3]] either way."""
    if column and x.shape[0] >= 2:
        return torch.mm(weight, x.T).T
    return x @ weight.T


def column_faster(weight: torch.Tensor, rows=(2, 4, 8), repeats: int = 5) -> bool:
    """Whether (W @ x^T)^T beats `F.linear(x, W)` by COLUMN_GAIN over `rows`-row products
    (`product_seconds`); CPU only (elsewhere another library's kernels decide: False)."""
    if weight.device.type != "cpu":
        return False
    linear, column = product_seconds(weight, rows, repeats)
    return column * COLUMN_GAIN <= linear


def product_seconds(weight: torch.Tensor, rows=(2, 4, 8), repeats: int = 5) -> tuple[float, float]:
    """(F.linear's, the column product's) seconds: per row count the median of `repeats`
    timed calls after a warm-up, summed over `rows`; the two alternate on fresh inputs."""
    products = {
        "linear": lambda x: F.linear(x, weight),
        "column": lambda x: torch.mm(weight, x.T).T,
    }
    total = dict.fromkeys(products, 0.0)
    with torch.inference_mode():
        for m in rows:
            samples = {name: [] for name in products}
            for _ in range(repeats + 1):
                for name, product in products.items():
                    x = torch.randn(m, weight.shape[1], dtype=weight.dtype, device=weight.device)
                    start = time.perf_counter()
                    product(x)
                    samples[name].append(time.perf_counter() - start)
            for name, got in samples.items():
                total[name] += statistics.median(got[1:])
    return total["linear"], total["column"]


def install_head(model, float32: bool = False) -> str | None:
    """Serve `model`'s LM head as an `LmHead` (once): in float32 when `float32` and the model
    is not, with the column product where `column_faster` says so. Returns what changed, for
    the log (None: nothing did)."""
    head = model.get_output_embeddings()
    if isinstance(head, LmHead) or not isinstance(head, torch.nn.Linear):
        return None
    weight, bias, changes = head.weight, head.bias, []
    if float32 and weight.dtype != torch.float32:
        weight = torch.nn.Parameter(weight.detach().float(), requires_grad=False)
        if bias is not None:
            bias = torch.nn.Parameter(bias.detach().float(), requires_grad=False)
        changes.append("in float32")
    column = weight.dtype == torch.float32 and column_faster(weight)
    if column:
        changes.append("multi-row products as (W @ x^T)^T (measured faster here)")
    if not changes:
        return None
    model.set_output_embeddings(LmHead(weight, bias, column).to(weight.device))
    return "the LM head runs " + ", ".join(changes)


def column_head(model) -> bool:
    """Whether the model's LM head serves multi-row products as columns (not row-tiled)."""
    head = model.get_output_embeddings()
    return isinstance(head, LmHead) and head.column and "forward" not in head.__dict__
