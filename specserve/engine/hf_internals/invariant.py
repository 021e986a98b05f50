"""Position-invariant attention: a query at position t attends keys 0..t reduced in the same
blocks and order whatever the layout around it (verify width, tree, batch rows, cache length),
so a token's output is a function of its token prefix only where the primitives are row-invariant.

Each query row's keys split at S(t) = max(0, floor((t - DEPTH) / BLOCK) * BLOCK), a function of
t alone: keys [0, S) are the row's held columns 0..S-1 (position = column there), reduced by the
flash kernel with the rest masked (a masked tail, measured invariant); keys [S, t] (at most
TAIL of them: held columns and the row's own tree ancestors) are gathered into position order at
slots 0.. of a TAIL-wide block, one batch entry per query row. The two partials (output and
log-sum-exp) merge in float32. Example: t = 100 -> S = 64: columns 0..63 by the flash kernel,
positions 64..100 gathered (whether they sit in the cache or in this forward's tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

BLOCK = 32  # split points are multiples of this (the flash kernel's masked tail is invariant there)
DEPTH = 32  # a query may sit at most this far past the positions its row held before the forward
TAIL = BLOCK + DEPTH  # keys [S, t] per query row
CALL_COST = 800  # a flash call's fixed cost in query-row x key-column products (~11 us, AMX Xeon)
INVARIANT_ATTENTION = "specserve_invariant"

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class DraftTooDeep(ValueError):
    """A query row sits further past its row's held positions than `DEPTH`."""


def flash_attention(query, key, value, mask, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU flash kernel: output [b, heads, q, d] and log-sum-exp [b, heads, q]."""
    return _flash(query, key, value, 0.0, False, attn_mask=mask, scale=scale)[:2]


def split_point(positions: torch.Tensor) -> torch.Tensor:
    """S(t) per query position (same shape). Example: [0, 40, 63, 64, 100, 500] ->
    [0, 0, 0, 32, 64, 448]."""
    return ((positions - DEPTH).clamp(min=0) // BLOCK) * BLOCK


@dataclass(frozen=True)
class InvariantLayout:
    """What every attention layer of one forward needs, built once (`layout`); G query heads
    share a key/value head, and a batch row's G * q query rows are head-major (g * q + i).
    Every query row is computed (R = b * q, row r = b * q + i)."""

    heads_per_kv: int  # G
    queries: int  # q query rows per batch row
    head_rows: int  # G * q, padded so no flash query block holds a single row
    flash_calls: list[
        tuple[int, int, int]
    ]  # (first, end, width): batch rows [first, end) in one call
    flash_mask: list[torch.Tensor]  # per call: [end - first, 1, head_rows, width] additive
    tail_batch: torch.Tensor  # [R] batch row of each query row
    tail_columns: torch.Tensor  # [R, TAIL] key columns of positions S..t in order (0-padded)
    tail_mask: torch.Tensor  # [R, 1, G', TAIL] additive: slots past t masked (G' >= 2)
    keyless: torch.Tensor | None  # [b, 1, 1, q] rows without keys before S (None: no such row)
    gather_index: dict = field(default_factory=dict)  # (strides) -> flat index (`_gather`)


def flash_calls(widths: list[int], head_rows: int) -> list[tuple[int, int, int]]:
    """Batch rows [first, end) that share one flash call, padded to their widest row, and that
    width: the partition of the rows, in order, with the least estimated cost (CALL_COST per call
    plus rows x head_rows x width), rows that read no columns left out. Example (head_rows 3):
    widths [300, 300, 0, 32, 800] -> [(0, 2, 300), (3, 4, 32), (4, 5, 800)]."""
    n = len(widths)
    best = [0.0] + [float("inf")] * n  # best[e]: least cost of rows [0, e)
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        widest = 0
        for first in range(end - 1, -1, -1):
            widest = max(widest, widths[first])
            cost = best[first] + (CALL_COST + (end - first) * head_rows * widest if widest else 0)
            if cost < best[end]:
                best[end], cut[end] = cost, first
    calls, end = [], n
    while end > 0:
        first = cut[end]
        widest = max(widths[first:end])
        if widest:
            calls.append((first, end, widest))
        end = first
    return calls[::-1]


def _head_rows(heads_per_kv: int, q: int) -> int:
    """G * q, plus one padding row where the flash kernel's last query block (32 rows; 64 or
    256 for long inputs, all multiples of 32) would hold a single row, which takes another path.
    Example: G 3, q 11 -> 34 (33 would leave row 32 alone)."""
    rows = heads_per_kv * q
    return rows + 1 if rows % 32 == 1 else rows


def layout(
    allowed: torch.Tensor, positions: torch.Tensor, heads_per_kv: int, dtype, device
) -> InvariantLayout:
    """The layout of a forward whose query rows [b, q] sit at `positions` and may attend the key
    columns `allowed` [b, q, columns] marks. Every row must see columns [0, S(t)) (its held
    positions, in order) and at most TAIL columns from S(t) on; raises `DraftTooDeep` otherwise."""
    b, q, _ = allowed.shape
    split = split_point(positions)  # [b, q]
    head_rows = _head_rows(heads_per_kv, q)
    widths = split.amax(dim=1).tolist()  # [b]
    calls = flash_calls(widths, head_rows)
    masks = [
        _flash_mask(allowed[a:e], split[a:e], w, heads_per_kv, head_rows, dtype, device)
        for a, e, w in calls
    ]
    tail = allowed & (torch.arange(allowed.shape[2])[None, None, :] >= split[..., None])
    counts = tail.sum(dim=2).reshape(-1)  # [R]
    if int(counts.max()) > TAIL:
        raise DraftTooDeep(
            f"a query row attends {int(counts.max())} keys past its split point; the invariant "
            f"attention takes at most {TAIL} (drafts up to {DEPTH} positions deep)"
        )
    order = torch.sort((~tail.reshape(b * q, -1)).to(torch.int8), dim=1, stable=True)
    columns = order.indices[:, :TAIL]  # allowed columns first, in column (= position) order
    columns = torch.nn.functional.pad(columns, (0, TAIL - columns.shape[1]))  # short caches
    slots = torch.arange(TAIL)[None, :] < counts[:, None]  # [R, TAIL]
    columns = torch.where(slots, columns, 0)
    group = max(heads_per_kv, 2)  # the flash kernel's lone-row path again: never one query row
    tail_mask = _additive(slots, dtype, device)[:, None, None, :].expand(-1, 1, group, -1)
    covered = torch.zeros(b, dtype=torch.bool)
    for a, e, _ in calls:
        covered[a:e] = True
    keyless = (split == 0) & covered[:, None]  # [b, q] rows fully masked in a call
    return InvariantLayout(
        heads_per_kv=heads_per_kv,
        queries=q,
        head_rows=head_rows,
        flash_calls=calls,
        flash_mask=masks,
        tail_batch=torch.arange(b).repeat_interleave(q).to(device),
        tail_columns=columns.to(device),
        tail_mask=tail_mask.contiguous(),
        keyless=keyless[:, None, None, :].to(device) if bool(keyless.any()) else None,
    )


def _flash_mask(allowed, split, width: int, group: int, head_rows: int, dtype, device):
    """The flash mask [b, 1, head_rows, width]: query row i of batch row r keeps [0, split[r, i])
    (which it must see: its held positions; the rest is a masked tail, measured invariant at any
    width)."""
    keep = torch.arange(width)[None, None, :] < split[..., None]  # [b, q, width]
    if bool((keep & ~allowed[:, :, :width]).any()):
        raise DraftTooDeep(
            "a query row does not see every position before its split point: its row's held "
            f"positions end less than {DEPTH} before it"
        )
    rows = keep.repeat(1, group, 1)  # [b, G * q, width], head-major
    if head_rows > rows.shape[1]:
        rows = torch.cat([rows, rows[:, :1]], dim=1)
    return _additive(rows, dtype, device)[:, None]


def _additive(allowed: torch.Tensor, dtype, device) -> torch.Tensor:
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed.to(device), float("-inf"))


def invariant_attention(module, query, key, value, layout: InvariantLayout, scaling=None):
    """Attention of query [b, H, q, d] over key / value [b, KVH, columns, d] by `layout`;
    returns [b, q, H, d]. The merge is one lerp per element: flash + w (tail - flash) with
    w = sigmoid(lse_tail - lse_flash), the tail's share (1 for a row without keys before S)."""
    b, heads, q, d = query.shape
    kv_heads, group = key.shape[1], layout.heads_per_kv
    flash_out, flash_lse = _flash_part(query, key, value, layout, scaling)  # [b, KVH, G, q(, d)]
    tail_out, tail_lse = _tail_part(query, key, value, layout, scaling)
    share = torch.sigmoid(tail_lse - flash_lse)[..., None].to(query.dtype)  # [b, KVH, G, q, 1]
    out = query.new_empty(b, q, kv_heads, group, d)
    torch.lerp(flash_out, tail_out, share, out=out.permute(0, 2, 3, 1, 4))
    return out.view(b, q, heads, d)


def _flash_part(query, key, value, layout: InvariantLayout, scaling):
    """The flash kernel over columns [0, S) of each query row (a masked tail), batch rows in the
    layout's calls: outputs [b, KVH, G, q, d] (zero without keys) and log-sum-exp [b, KVH, G, q]
    (-inf without keys)."""
    b, _, q, d = query.shape
    kv_heads, group = key.shape[1], layout.heads_per_kv
    folded = query.reshape(b, kv_heads, group * q, d)  # [b, KVH, G q, d], head-major rows
    if layout.head_rows > group * q:
        folded = torch.cat([folded, folded[:, :, :1]], dim=2)
    calls = layout.flash_calls
    if len(calls) == 1 and calls[0][:2] == (0, b):  # every row in one call
        out, lse = _flash_call(folded, key, value, calls[0], layout.flash_mask[0], scaling)
    else:
        out = folded.new_zeros(b, kv_heads, layout.head_rows, d)
        lse = out.new_full((b, kv_heads, layout.head_rows), -torch.inf, dtype=torch.float32)
        for call, mask in zip(calls, layout.flash_mask, strict=True):
            part_out, part_lse = _flash_call(folded, key, value, call, mask, scaling)
            out[call[0] : call[1]], lse[call[0] : call[1]] = part_out, part_lse
    out = out[:, :, : group * q].view(b, kv_heads, group, q, d)
    lse = lse[:, :, : group * q].view(b, kv_heads, group, q)
    if layout.keyless is not None:  # the kernel gives such rows lse 0: they have no keys
        lse = lse.masked_fill(layout.keyless, -torch.inf)
    return out, lse


def _flash_call(folded, key, value, call: tuple[int, int, int], mask, scaling):
    """One flash call: batch rows [first, end) over key columns [0, width)."""
    first, end, width = call
    keys, values = key[first:end, :, :width], value[first:end, :, :width]
    return flash_attention(folded[first:end], keys, values, mask, scaling)


def _tail_part(query, key, value, layout: InvariantLayout, scaling):
    """Per query row, the flash kernel over its keys [S, t] gathered into position order (one
    batch entry each): outputs [b, KVH, G, q, d] and log-sum-exp [b, KVH, G, q] (views)."""
    b, _, q, d = query.shape
    kv_heads, group = key.shape[1], layout.heads_per_kv
    queries = query.transpose(1, 2).reshape(b * q, kv_heads, group, d)  # [R, KVH, G, d]
    if group == 1:  # the flash kernel's lone-row path: compute the row twice
        queries = torch.cat([queries, queries], dim=2)
    keys, values = _gather(key, layout), _gather(value, layout)  # [R, KVH, TAIL, d]
    mask = layout.tail_mask
    o, lse = _flash(queries, keys, values, 0.0, False, attn_mask=mask, scale=scaling)[:2]
    o = o[:, :, :group].view(b, q, kv_heads, group, d).permute(0, 2, 3, 1, 4)
    return o, lse[:, :, :group].view(b, q, kv_heads, group).permute(0, 2, 3, 1)


def _gather(states: torch.Tensor, layout: InvariantLayout) -> torch.Tensor:
    """[R, KVH, TAIL, d]: row r's entries at columns tail_columns[r] of batch row tail_batch[r]
    (one index_select over the entries' storage rows: strides are multiples of d; the index is
    built once per forward and stride pattern, as every layer's cache shares its layout)."""
    b, kv_heads, columns, d = states.shape
    batch_stride, head_stride, column_stride, one = states.stride()
    if one != 1 or column_stride != d or batch_stride % d or head_stride % d:
        states = states.contiguous()
        batch_stride, head_stride, column_stride, _ = states.stride()
    key = (batch_stride, head_stride, d)
    index = layout.gather_index.get(key)
    if index is None:
        heads = torch.arange(kv_heads, device=states.device) * (head_stride // d)  # [KVH]
        base = layout.tail_batch * (batch_stride // d)  # [R]
        index = base[:, None, None] + heads[None, :, None] + layout.tail_columns[:, None, :]
        index = layout.gather_index[key] = index.reshape(-1)  # [R KVH TAIL]
    top = ((b - 1) * batch_stride + (kv_heads - 1) * head_stride) // d + columns
    flat = states.as_strided((top, d), (d, 1), states.storage_offset())
    return flat.index_select(0, index).reshape(-1, kv_heads, TAIL, d)
