"""Position-invariant attention: a query at position t attends keys 0..t reduced in the same
blocks and order whatever the layout around it (verify width, tree, batch rows, cache length),
so a token's output is a function of its token prefix only where the primitives are row-invariant.

Each query row's keys split at S(t) = max(0, floor((t - DEPTH) / BLOCK) * BLOCK), a function of
t alone: keys [0, S) are the row's held columns 0..S-1 (position = column there), reduced by the
flash kernel with the rest masked (a masked tail, measured invariant); keys [S, t] (at most
TAIL of them: held columns and the row's own tree ancestors) sit in position order at slots 0..
of a TAIL-wide block: read in place where they are the columns S..t (a chain, a decode step),
else gathered, one batch entry per query row (a tree). The two partials (output and log-sum-exp)
merge in float32. Example: t = 100 -> S = 64: columns 0..63 by the flash kernel, positions
64..100 in the TAIL block (whether they sit in the cache or in this forward's tree).
The layout each forward needs is built once (`invariant_layout`).
"""

from __future__ import annotations

import itertools

import torch

from specserve.engine.hf_internals.invariant_plan import TAIL, InvariantLayout, TailWindows
from specserve.engine.hf_internals.storage_rows import entry_index, row_strided, rows_of

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def flash_attention(query, key, value, mask, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU flash kernel: output [b, heads, q, d] and log-sum-exp [b, heads, q]."""
    return _flash(query, key, value, 0.0, False, attn_mask=mask, scale=scale)[:2]


def invariant_attention(module, query, key, value, layout: InvariantLayout, scaling=None):
    """Attention of query [b, H, q, d] over key / value [b, KVH, columns, d] by `layout`;
    returns [b, q, H, d]. The merge is one lerp per element: flash + w (tail - flash) with
    w = sigmoid(lse_tail - lse_flash), the tail's share (1 for a row without keys before S)."""
    b, heads, q, d = query.shape
    kv_heads, group = key.shape[1], layout.heads_per_kv
    folded = query.reshape(b, kv_heads, group * q, d)  # [b, KVH, G q, d], head-major rows
    if layout.head_rows > group * q:
        folded = torch.cat([folded, folded[:, :, :1]], dim=2)
    flash_out, flash_lse = _flash_part(folded, key, value, layout, scaling)  # [b, KVH, G, q(, d)]
    if layout.windows is not None:
        tail_out, tail_lse = _window_part(folded, key, value, layout, scaling)
    else:
        tail_out, tail_lse = _tail_part(query, key, value, layout, scaling)
    share = (tail_lse - flash_lse).sigmoid_()[..., None].to(query.dtype)  # [b, KVH, G, q, 1]
    out = query.new_empty(b, q, kv_heads, group, d)
    torch.lerp(flash_out, tail_out, share, out=out.permute(0, 2, 3, 1, 4))
    return out.view(b, q, heads, d)


def _flash_part(folded, key, value, layout: InvariantLayout, scaling):
    """The flash kernel over columns [0, S) of each query row (a masked tail), batch rows in the
    layout's calls: outputs [b, KVH, G, q, d] (zero without keys) and log-sum-exp [b, KVH, G, q]
    (-inf without keys)."""
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
    out, lse = _unfold(out, lse, layout)
    if layout.keyless is not None:  # the kernel gives such rows lse 0: they have no keys
        lse = lse.masked_fill(layout.keyless, -torch.inf)
    return out, lse


def _unfold(out, lse, layout: InvariantLayout):
    """[n, KVH, head_rows(, d)] -> [n, KVH, G, q(, d)]: the padding row dropped, heads apart."""
    n, kv_heads, rows, d = out.shape
    group, q = layout.heads_per_kv, layout.queries
    if rows > group * q:
        out, lse = out[:, :, : group * q], lse[:, :, : group * q]
    return out.view(n, kv_heads, group, q, d), lse.view(n, kv_heads, group, q)


def _window_part(folded, key, value, layout: InvariantLayout, scaling):
    """The tails read in place (`TailWindows`): one flash call over the entries' TAIL-column
    windows, each query row taken from its own entry: [b, KVH, G, q, d] and [b, KVH, G, q]."""
    windows = layout.windows
    b, kv_heads, _, d = folded.shape
    if windows.source is not None:  # gather each entry's member rows
        flat = folded.transpose(1, 2).reshape(-1, kv_heads, d)  # [b head_rows, KVH, d]
        folded = flat.index_select(0, windows.source).view(len(windows.batch), -1, kv_heads, d)
        folded = folded.transpose(1, 2).contiguous()  # [E, KVH, window_rows, d]
    keys, values = tail_windows(key, windows), tail_windows(value, windows)  # [E, KVH, TAIL, d]
    out, lse = _flash(folded, keys, values, 0.0, False, attn_mask=windows.mask, scale=scaling)[:2]
    if windows.back is None:
        return _unfold(out, lse, layout)
    group, q = layout.heads_per_kv, layout.queries
    out = out.transpose(1, 2).reshape(-1, kv_heads, d).index_select(0, windows.back)
    lse = lse.transpose(1, 2).reshape(-1, kv_heads).index_select(0, windows.back)
    return out.view(b, group, q, kv_heads, d).permute(0, 3, 1, 2, 4), lse.view(
        b, group, q, kv_heads
    ).permute(0, 3, 1, 2)


def tail_windows(states: torch.Tensor, windows: TailWindows) -> torch.Tensor:
    """[E, KVH, TAIL, d]: columns start..start + TAIL of each entry's batch row, a view into
    the cache's storage where it reaches that far and the entries' offsets step evenly (the
    columns past the held ones are finite: zeros or stale entries, all masked); else one gather
    (columns past the cache's last read as its last: masked too). The view or the gather's
    index is worked out once per cache geometry (every layer's cache shares one)."""
    states = row_strided(states)
    room = states.untyped_storage().nbytes() // states.element_size() - states.storage_offset()
    geometry = (states.shape, states.stride(), room)
    if geometry not in windows.views:
        view = _window_view(states, windows, room)
        windows.views[geometry] = view if view is not None else _window_index(states, windows)
    view = windows.views[geometry]
    if isinstance(view, torch.Tensor):  # the gather's index
        _, kv_heads, _, d = states.shape
        rows = rows_of(states).index_select(0, view)  # [E KVH TAIL, d]
        return rows.view(len(windows.batch), kv_heads, TAIL, d)
    size, stride, offset = view
    return states.as_strided(size, stride, states.storage_offset() + offset)


def _window_index(states: torch.Tensor, windows: TailWindows) -> torch.Tensor:
    """[E KVH TAIL] rows of `rows_of(states)`: each entry's TAIL columns from its start."""
    column = torch.tensor(windows.start)[:, None] + torch.arange(TAIL)[None, :]  # [E, TAIL]
    column = column.clamp(max=states.shape[2] - 1).to(states.device)
    return entry_index(states, torch.tensor(windows.batch, device=states.device), column)


def _window_view(states: torch.Tensor, windows: TailWindows, room: int):
    """(size, stride, offset) of the windows as one strided view of `states`' storage, or None
    where it would run past the storage (`room` elements) or the offsets do not step evenly."""
    _, kv_heads, _, d = states.shape
    batch_stride, head_stride, column_stride, one = states.stride()
    offsets = [i * batch_stride + s * column_stride for i, s in zip(windows.batch, windows.start)]
    steps = {b - a for a, b in itertools.pairwise(offsets)}
    last = offsets[-1] + (kv_heads - 1) * head_stride + (TAIL - 1) * column_stride + (d - 1) * one
    if last >= room or len(steps) > 1 or min(steps, default=1) <= 0:
        return None
    step = steps.pop() if steps else batch_stride
    return (len(offsets), kv_heads, TAIL, d), (step, head_stride, column_stride, one), offsets[0]


def _flash_call(folded, key, value, call: tuple[int, int, int], mask, scaling):
    """One flash call: batch rows [first, end) over key columns [0, width)."""
    first, end, width = call
    if (first, end) != (0, key.shape[0]):
        folded, key, value = folded[first:end], key[first:end], value[first:end]
    keys, values = key.narrow(2, 0, width), value.narrow(2, 0, width)
    return flash_attention(folded, keys, values, mask, scaling)


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
    states = row_strided(states)
    _, kv_heads, _, d = states.shape
    key = (*states.stride()[:2], d)
    index = layout.gather_index.get(key)
    if index is None:  # [R KVH TAIL]
        index = entry_index(states, layout.tail_batch, layout.tail_columns)
        layout.gather_index[key] = index
    return rows_of(states).index_select(0, index).reshape(-1, kv_heads, TAIL, d)
