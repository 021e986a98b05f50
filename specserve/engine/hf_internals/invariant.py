"""Position-invariant attention: a query at position t attends keys 0..t reduced in the same
blocks and order whatever the layout around it (verify width, tree, batch rows, cache length),
so a token's output is a function of its token prefix only where the primitives are row-invariant.

Each query row's keys split at S(t) = max(0, floor((t - DEPTH) / BLOCK) * BLOCK), a function of
t alone: keys [0, S) are the row's held columns 0..S-1 (position = column there), reduced by the
flash kernel with the rest masked (a masked tail, measured invariant); keys [S, t] (at most TAIL
of them: held columns and the row's own tree ancestors, `layout.tail_columns` in position order)
go to the engine's tail kernel (`kernels`, C), which folds them into each query vector's flash
partial (output, log-sum-exp) in blocks of 32 positions from S, in float32 and a fixed order,
every step a function of that vector's query and keys alone. Example: t = 100
-> S = 64: columns 0..63 by the flash kernel, positions 64..100 by the tail kernel (whether they
sit in the cache or in this forward's tree). The layout is built once a forward (`invariant_layout`).
"""

from __future__ import annotations

import ctypes

import torch

from specserve.engine import kernels
from specserve.engine.hf_internals.invariant_plan import InvariantLayout

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def flash_attention(query, key, value, mask, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU flash kernel: output [b, heads, q, d] and log-sum-exp [b, heads, q]."""
    return _flash(query, key, value, 0.0, False, attn_mask=mask, scale=scale)[:2]


def invariant_attention(module, query, key, value, layout: InvariantLayout, scaling=None):
    """Attention of query [b, H, q, d] over key / value [b, KVH, columns, d] by `layout`;
    returns [b, q, H, d]: the flash kernel's partial over keys [0, S) of each query row, then
    the tail kernel (`kernels.tail_attention`) over its keys [S, t] merged with that partial."""
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    folded = query.reshape(b, kv_heads, layout.heads_per_kv * q, d)  # [b, KVH, G q, d]
    extra = layout.head_rows - layout.heads_per_kv * q  # padding rows: copies of row 0
    if extra:
        folded = torch.cat([folded, folded[:, :, :1].expand(b, kv_heads, extra, d)], dim=2)
    flash_out, flash_lse = _flash_part(folded, key, value, layout, scaling)  # [b, KVH, rows(, d)]
    out = query.new_empty(b, q, heads, d)
    scale = scaling if scaling is not None else d**-0.5
    tail_attention(query, key, value, flash_out, flash_lse, out, layout, scale)
    return out


def tail_attention(query, key, value, flash_out, flash_lse, out, layout, scale: float) -> None:
    """Write `out` [b, q, H, d]: per query row its tail keys (`layout.tail_columns`) merged with
    its flash partial (flash_out [b, KVH, head_rows, d], flash_lse [b, KVH, head_rows])."""
    if query.stride(-1) != 1:
        query = query.contiguous()
    geometry = (
        query.shape,
        query.stride(),
        key.shape,
        key.stride(),
        value.stride(),
        flash_out.stride(),
        flash_lse.stride(),
        query.dtype,
    )
    ints = layout.kernel_args.get(geometry)
    if ints is None:
        ints = layout.kernel_args[geometry] = _kernel_args(
            query, key, value, flash_out, flash_lse, layout
        )
    ptrs = (ctypes.c_void_p * 8)(
        query.data_ptr(),
        key.data_ptr(),
        value.data_ptr(),
        flash_out.data_ptr(),
        flash_lse.data_ptr(),
        out.data_ptr(),
        layout.tail_columns.data_ptr(),
        layout.tail_counts.data_ptr(),
    )
    if kernels.tail_kernel().tail_attention(ptrs, ints, scale):
        raise kernels.KernelUnavailable(
            f"the tail kernel refused the call: head_dim {query.shape[-1]}, every row's tail "
            f"count in 1..{layout.tail_columns.shape[1]}"
        )


def _kernel_args(query, key, value, flash_out, flash_lse, layout):
    """The kernel's integer arguments (`tail_attention.c`): strides and sizes, checked."""
    rows_contiguous = key.stride(-1) == value.stride(-1) == flash_out.stride(-1) == 1
    if query.dtype not in _ELEMENT or flash_lse.dtype != torch.float32 or not rows_contiguous:
        raise ValueError(
            "the tail kernel takes bf16 / fp32 keys, values and partials with contiguous rows "
            f"and a float32 log-sum-exp, got {query.dtype} ({flash_lse.dtype}), strides "
            f"{key.stride()}, {value.stride()} and {flash_out.stride()}"
        )
    b, heads, q, d = query.shape
    if d % kernels.LANES or d > kernels.MAX_HEAD_DIM:
        raise kernels.KernelUnavailable(
            f"the tail kernel takes head_dim a multiple of {kernels.LANES} up to "
            f"{kernels.MAX_HEAD_DIM}, not {d}"
        )
    rows = b * q * key.shape[1]  # (query row, kv head) items
    threads = torch.get_num_threads() if rows >= PARALLEL_ITEMS else 1
    sizes = (
        b * q,
        layout.tail_columns.shape[1],
        q,
        heads,
        key.shape[1],
        d,
        _ELEMENT[query.dtype],
        threads,
    )
    values = (
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *flash_out.stride(),
        *flash_lse.stride(),
        *sizes,
    )
    return (ctypes.c_long * len(values))(*values)


_ELEMENT = {torch.bfloat16: 1, torch.float32: 0}
PARALLEL_ITEMS = 2  # (query row, kv head) items from which the tail kernel runs on every thread


def _flash_part(folded, key, value, layout: InvariantLayout, scaling):
    """The flash kernel over columns [0, S) of each query row (a masked tail), batch rows in the
    layout's calls: outputs [b, KVH, head_rows, d] (zero without keys) and log-sum-exp
    [b, KVH, head_rows] (-inf without keys)."""
    b, kv_heads, _, d = folded.shape
    calls = layout.flash_calls
    if len(calls) == 1 and calls[0][:2] == (0, b):  # every row in one call
        out, lse = _flash_call(folded, key, value, calls[0], layout.flash_mask[0], scaling)
    else:
        out = folded.new_zeros(b, kv_heads, layout.head_rows, d)
        lse = out.new_full((b, kv_heads, layout.head_rows), -torch.inf, dtype=torch.float32)
        for call, mask in zip(calls, layout.flash_mask, strict=True):
            part_out, part_lse = _flash_call(folded, key, value, call, mask, scaling)
            out[call[0] : call[1]], lse[call[0] : call[1]] = part_out, part_lse
    if layout.keyless is not None:  # the kernel gives such rows lse 0: they have no keys
        lse = lse.masked_fill(layout.keyless, -torch.inf)
    return out, lse


def _flash_call(folded, key, value, call: tuple[int, int, int], mask, scaling):
    """One flash call: batch rows [first, end) over key columns [0, width)."""
    first, end, width = call
    if (first, end) != (0, key.shape[0]):
        folded, key, value = folded[first:end], key[first:end], value[first:end]
    keys, values = key.narrow(2, 0, width), value.narrow(2, 0, width)
    return flash_attention(folded, keys, values, mask, scaling)
