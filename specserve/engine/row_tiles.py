"""Linears in row tiles: where a kernel is row-invariant only up to T rows (oneDNN's bf16 AMX path
takes over above 32 rows on some CPUs), a longer product runs in tiles of at most T rows, so
row i of any product equals the 1-row product of its input. Prompt rows may instead run in
PREFILL_TILE-row tiles aligned to absolute positions (`aligned_prompt`): each prompt token then
always sits at the same row of the same tile shape, whatever the chunking, at the large-M speed.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PREFILL_TILE = 64  # prompt rows per aligned tile (positions [64 k, 64 k + 64))


@dataclass
class TilePlan:
    """The row tiles of a model's linears, shared by all of them: `tile` rows a product, and
    during an `aligned_prompt` forward of `rows` rows its first `aligned` rows in PREFILL_TILE
    tiles (0: none)."""

    tile: int
    rows: int = 0
    aligned: int = 0


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, plan: TilePlan | None = None):
    """`F.linear` in the plan's row tiles (None: one product). Example: x [2, 40, in], tile 32 ->
    products of 32, 32 and 16 rows, concatenated: [2, 40, out]; x [1, 150, in] in a forward
    whose first 128 rows are aligned -> 64, 64, then 22 rows."""
    rows = x.reshape(-1, x.shape[-1])  # [M, in]
    m = rows.shape[0]
    if plan is None or (m <= plan.tile and not (plan.aligned and m == plan.rows)):
        return F.linear(x, weight, bias)
    aligned = plan.aligned if m == plan.rows else 0
    cuts = list(range(0, aligned, PREFILL_TILE)) + list(range(aligned, m, plan.tile))
    ends = cuts[1:] + [m]
    parts = [F.linear(rows[a:b], weight, bias) for a, b in zip(cuts, ends, strict=True)]
    return torch.cat(parts).reshape(*x.shape[:-1], weight.shape[0])


def tile_linears(model: torch.nn.Module, tile: int) -> TilePlan:
    """Every `nn.Linear` of `model` computes in row tiles of `tile` (its hooks, e.g. the LoRA
    rows', still see the whole input; they read `row_plan` to tile their own products)."""
    plan = TilePlan(tile)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.row_plan = plan
            module.forward = functools.partial(_tiled_forward, module)
    model.row_plan = plan
    return plan


def row_plan(module: torch.nn.Module) -> TilePlan | None:
    """The plan `tile_linears` gave this module (None: untiled)."""
    return getattr(module, "row_plan", None)


def aligned_rows(past: int, pending: int) -> int:
    """How many of a forward's first `pending` rows (prompt tokens at positions past, past + 1,
    ...) fill whole PREFILL_TILE tiles aligned to absolute positions: 0 unless past is a
    multiple of the tile. Example: past 128, pending 150 -> 128; past 100 -> 0."""
    if past % PREFILL_TILE:
        return 0
    return pending // PREFILL_TILE * PREFILL_TILE


def aligned_chunk(past: int, budget: int) -> int:
    """The largest prefill chunk of at most `budget` tokens after `past` that ends on a tile
    boundary (so the next chunk starts aligned); 0 when none fits. Example: past 64, budget
    100 -> 64; past 0, budget 40 -> 0."""
    return max(0, (past + budget) // PREFILL_TILE * PREFILL_TILE - past)


@contextlib.contextmanager
def aligned_prompt(model: torch.nn.Module, rows: int, aligned: int):
    """During a forward of `rows` rows whose first `aligned` are aligned prompt rows (see
    `aligned_rows`), those run in PREFILL_TILE tiles; no effect on an untiled model."""
    plan = getattr(model, "row_plan", None)
    if plan is None or aligned == 0:
        yield
        return
    plan.rows, plan.aligned = rows, aligned
    try:
        yield
    finally:
        plan.rows, plan.aligned = 0, 0


def _tiled_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, module.weight, module.bias, module.row_plan)
