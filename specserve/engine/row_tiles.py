"""Linears in row tiles: where a kernel is row-invariant only up to T rows (oneDNN's bf16 AMX path
takes over above 32 rows on some CPUs), a longer product runs in tiles of at most T rows, so
row i of any product equals the 1-row product of its input.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, tile: int | None = None):
    """`F.linear` with at most `tile` rows per product (None: one product). Example: x [2, 40, in]
    with tile 32 -> products of 32, 32 and 16 rows, concatenated: [2, 40, out]."""
    rows = x.reshape(-1, x.shape[-1])  # [M, in]
    if tile is None or rows.shape[0] <= tile:
        return F.linear(x, weight, bias)
    parts = [F.linear(rows[i : i + tile], weight, bias) for i in range(0, rows.shape[0], tile)]
    return torch.cat(parts).reshape(*x.shape[:-1], weight.shape[0])


def tile_linears(model: torch.nn.Module, tile: int) -> None:
    """Every `nn.Linear` of `model` computes in row tiles of `tile` (its hooks, e.g. the LoRA
    rows', still see the whole input; they read `row_tile` to tile their own products)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and getattr(module, "row_tile", None) != tile:
            module.row_tile = tile
            module.forward = functools.partial(_tiled_forward, module)


def row_tile(module: torch.nn.Module) -> int | None:
    """The row tile `tile_linears` gave this module (None: untiled)."""
    return getattr(module, "row_tile", None)


def _tiled_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, module.weight, module.bias, module.row_tile)
