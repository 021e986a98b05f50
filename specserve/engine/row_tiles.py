"""Linears in row tiles: where a kernel is row-invariant only up to T rows (oneDNN's bf16 AMX path
takes over above 32 rows on some CPUs), a longer product runs in tiles of at most T rows, so
row i of any product equals the 1-row product of its input. Prompt rows may instead run in
tiles aligned to absolute positions (`aligned_prompt`): whole BLOCK_TILE blocks of the prompt in
one product, the rest in PREFILL_TILE tiles, chunks never cutting a block (`aligned_chunk`); each
prompt token then sits at the same row of the same tile shape whatever the chunking.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PREFILL_TILE = 64  # prompt rows per aligned tile (positions [64 k, 64 k + 64))
BLOCK_TILE = 256  # ...or per block, where the prompt fills [256 k, 256 k + 256): M = 256 costs
# 2.8 us a row against 5.2 at 64 (bf16 AMX Xeon, SmolLM2's linears)


WHOLE = 1 << 62  # a tile no product reaches: one product whatever its rows


@dataclass
class TilePlan:
    """The row tiles of a model's linears, shared by all of them: `tile` rows a product, a
    product of fewer than `pad` rows padded with zero rows to `pad`, and during an
    `aligned_prompt` forward of `rows` rows from position `start` its first `aligned` rows in
    aligned tiles (`prompt_cuts`; 0: none)."""

    tile: int
    rows: int = 0
    aligned: int = 0
    start: int = 0
    pad: int = 1


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, plan: TilePlan | None = None):
    """`F.linear` in the plan's row tiles (None: one product). Example: x [2, 40, in], tile 32 ->
    products of 32, 32 and 16 rows, concatenated: [2, 40, out]; x [1, 150, in] in a forward
    from position 0 whose first 128 rows are aligned -> 64, 64, then 22 rows; x [1, 1, in],
    pad 2 -> the product of x and a zero row, its first row kept."""
    rows = x.reshape(-1, x.shape[-1])  # [M, in]
    m = rows.shape[0]
    if plan is not None and m < plan.pad:
        padded = torch.cat([rows, rows.new_zeros(plan.pad - m, rows.shape[1])])  # [pad, in]
        return F.linear(padded, weight, bias)[:m].reshape(*x.shape[:-1], weight.shape[0])
    if plan is None or (m <= plan.tile and not (plan.aligned and m == plan.rows)):
        return F.linear(x, weight, bias)
    aligned = plan.aligned if m == plan.rows else 0
    cuts = prompt_cuts(plan.start, aligned) + list(range(aligned, m, plan.tile))
    ends = cuts[1:] + [m]
    parts = [F.linear(rows[a:b], weight, bias) for a, b in zip(cuts, ends, strict=True)]
    return torch.cat(parts).reshape(*x.shape[:-1], weight.shape[0])


def tile_linears(
    model: torch.nn.Module,
    tile: int,
    untiled: frozenset[tuple[int, int]] = frozenset(),
    dtype: torch.dtype | None = None,
    pad: int = 1,
) -> TilePlan:
    """Every `nn.Linear` of `model` computes in row tiles of `tile`, products of fewer than
    `pad` rows padded to it, except those of an (in, out) shape in `untiled` with weights in
    `dtype` (the probe found them invariant at any rows), whose own product stays as it is.
    Every linear carries the plan for its hooks (the LoRA rows' products, never probed, read
    `row_plan`). Inside the decoder stack the tiled forward is switched on only for forwards of
    more than `tile` rows, fewer than `pad` or aligned prompt rows: a Python wrapper per linear
    costs ~2 % of a short forward."""
    plan = TilePlan(tile, pad=pad)
    stack = _decoder_stack(model)
    in_stack = {id(m) for m in stack.modules()} if stack is not None else set()
    inner = []
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        module.row_plan = plan  # LoRA products (shapes never probed) follow it on every linear
        shape = (module.in_features, module.out_features)
        probed = shape in untiled and module.weight.dtype == dtype
        if not probed or getattr(module, "column", False):  # a column LM head was never probed
            if id(module) in in_stack:
                inner.append(module)
            else:
                module.forward = functools.partial(_tiled_forward, module)
    if stack is not None:
        switch = functools.partial(_switch_tiles, plan, tuple(inner))
        stack.register_forward_pre_hook(switch, with_kwargs=True)
        _set_tiled(inner, True)
    model.row_plan = plan
    return plan


def _decoder_stack(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder stack every forward of `model` runs through (None where the model names none)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    stack = getattr(base, getattr(base, "base_model_prefix", ""), None)
    return stack if isinstance(stack, torch.nn.Module) and stack is not base else None


def _switch_tiles(plan: TilePlan, linears: tuple, stack, args, kwargs) -> None:
    """Before a forward of the decoder stack: the tiled forward on its linears when some product
    may exceed a tile (more rows than `plan.tile`, aligned prompt rows, or rows unknown) or be
    padded (fewer than `plan.pad`), the linears' own forward otherwise."""
    states = kwargs.get("input_ids")
    if states is None:
        states = kwargs.get("inputs_embeds")
        states = states[..., 0] if states is not None else (args[0] if args else None)
    rows = states.numel() if isinstance(states, torch.Tensor) else None
    whole = rows is not None and plan.pad <= rows <= plan.tile
    _set_tiled(linears, not whole or bool(plan.aligned))


def _set_tiled(linears: tuple | list, tiled: bool) -> None:
    if not linears or ("forward" in linears[0].__dict__) == tiled:
        return
    for module in linears:
        if tiled:
            module.__dict__["forward"] = functools.partial(_tiled_forward, module)
        else:
            module.__dict__.pop("forward", None)


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


def prompt_cuts(start: int, rows: int) -> list[int]:
    """Where the aligned prompt tiles of `rows` rows from position `start` (a multiple of
    PREFILL_TILE) begin: a BLOCK_TILE block where the rows hold all of it, PREFILL_TILE tiles
    elsewhere. Example: start 192, rows 384 -> [0, 64, 320] (positions 192..255, then the block
    256..511, then 512..575)."""
    cuts, position, end = [], start, start + rows
    while position < end:
        cuts.append(position - start)
        whole = position % BLOCK_TILE == 0 and position + BLOCK_TILE <= end
        position += BLOCK_TILE if whole else PREFILL_TILE
    return cuts


def aligned_chunk(past: int, budget: int, prompt_end: int) -> int:
    """The largest prefill chunk of at most `budget` tokens after `past` that ends on a tile
    boundary and inside no BLOCK_TILE block the prompt fills (its aligned rows end at
    `prompt_end`), so every block is prefilled in one forward whatever the chunking; 0 when none
    fits. Examples: past 0, budget 300, prompt_end 700 -> 256; past 0, budget 200 -> 0 (it would
    cut the block 0..255); past 512, budget 100, prompt_end 700 -> 64 (512..767 is no block)."""
    end = (past + budget) // PREFILL_TILE * PREFILL_TILE
    blocks_end = prompt_end // BLOCK_TILE * BLOCK_TILE  # the prompt fills the blocks before it
    while end > past and end % BLOCK_TILE and end < blocks_end:
        end -= PREFILL_TILE
    return max(0, end - past)


@contextlib.contextmanager
def untiled(model: torch.nn.Module):
    """Every product of `model` in one piece meanwhile (its plan's tile unbounded): the plain
    forward Hugging Face `generate()` runs, for a baseline; no effect on an untiled model."""
    plan = getattr(model, "row_plan", None)
    if plan is None:
        yield
        return
    tile, plan.tile = plan.tile, 1 << 62
    try:
        yield
    finally:
        plan.tile = tile


@contextlib.contextmanager
def aligned_prompt(model: torch.nn.Module, rows: int, aligned: int, start: int):
    """During a forward of `rows` rows from position `start` whose first `aligned` are aligned
    prompt rows (see `aligned_rows`), those run in aligned tiles (`prompt_cuts`); no effect on
    an untiled model."""
    plan = getattr(model, "row_plan", None)
    if plan is None or aligned == 0:
        yield
        return
    plan.rows, plan.aligned, plan.start = rows, aligned, start
    try:
        yield
    finally:
        plan.rows, plan.aligned, plan.start = 0, 0, 0


def _tiled_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # in the weight's dtype, as a float32 LM head over a bf16 model takes its input
    return linear(x.to(module.weight.dtype), module.weight, module.bias, module.row_plan)
