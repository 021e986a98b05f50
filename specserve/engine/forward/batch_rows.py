"""The rows of a batched forward: each row's layout (`BatchRow` -> `build_batch_inputs`), the
masks over a `BatchKV`'s columns, and one run over them (`run_rows`: eager, or through the warm
compiled forward `verify_batch_forward` picked), split into one `ForwardOutput` per row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specserve.engine import hf_internals
from specserve.engine.forward.batch_cache import BatchKV
from specserve.engine.forward.inputs import (
    additive_mask,
    build_inputs,
    invariant_kwargs,
    window_allowed,
)
from specserve.engine.forward.single import ForwardOutput
from specserve.engine.lora.batch import lora_rows
from specserve.engine.tree import Draft, draft_width
from specserve.engine.verify import greedy_tokens


@dataclass(frozen=True)
class BatchRow:
    past: int  # positions this row holds in the batch cache
    pending: list[int]  # committed tokens not yet in the cache
    draft: Draft
    adapter: str | None = None
    feature_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class BatchInputs:
    input_ids: torch.Tensor  # [b, q]
    position_ids: torch.Tensor  # [b, q]
    allowed: torch.Tensor  # [b, q, columns] bool, in the columns of the `visible` given
    logit_rows: list[list[int]]  # per row: its query rows whose logits the verifier reads
    blocks: torch.Tensor  # [b, q, q] bool: what each query row sees of its own row's new block


def batch_width(rows: list[BatchRow], pad_to: int = 0) -> int:
    """Query rows of the forward: the widest row (pending + draft), at least `pad_to`."""
    return max(max(len(r.pending) + draft_width(r.draft) for r in rows), pad_to)


def build_batch_inputs(
    rows: list[BatchRow], visible: torch.Tensor, starts: list[int], q: int
) -> BatchInputs:
    """Stack each row's single-request layout (`inputs.build_inputs`), padded to q query rows;
    a row's past is its visible columns before `starts[b]` instead of a contiguous prefix, and
    its new block sits at columns [starts[b], starts[b] + q) of `visible` [b, columns].

    Example: visible [[T, T, F, F, F], [F, T, T, F, F]], starts [2, 3], q = 2 (rows of width 1
    and 2): row 0's padding query sees its held columns 0, 1 and itself (3); row 1's draft
    token sees 1, 2, its pending token (3) and itself (4).
    """
    ids, positions, logit_rows, blocks = [], [], [], []
    for row in rows:
        single = build_inputs(row.past, row.pending, row.draft, pad_to=q)
        ids.append(single.input_ids[0])
        positions.append(single.position_ids[0])
        logit_rows.append(single.logit_rows.tolist())
        blocks.append(single.allowed[:, row.past :])
    blocks = torch.stack(blocks)  # [b, q, q]
    allowed = allowed_in(visible, starts, blocks)
    return BatchInputs(torch.stack(ids), torch.stack(positions), allowed, logit_rows, blocks)


def allowed_in(visible: torch.Tensor, starts: list[int], blocks: torch.Tensor) -> torch.Tensor:
    """[b, q, columns]: row b's query rows see its held columns before starts[b] and, at
    [starts[b], starts[b] + q), what `blocks[b]` [q, q] allows of its new block."""
    b, q, _ = blocks.shape
    allowed = torch.zeros(b, q, visible.shape[1], dtype=torch.bool)
    for i, start in enumerate(starts):
        allowed[i, :, :start] = visible[i, :start]
        allowed[i, :, start : start + q] = blocks[i]
    return allowed


@torch.inference_mode()
def run_rows(model, kv: BatchKV, rows: list[BatchRow], q: int, fast=None) -> list[ForwardOutput]:
    """The forward itself: every row of `kv` gets q new columns; through `fast` (a warm
    `compiled_batch.CompiledBatch`) when given, else eager with per-layer-group masks."""
    layers = tuple(sorted({layer for row in rows for layer in row.feature_layers}))
    starts = kv.begin(q)
    inputs = build_batch_inputs(rows, kv.visible, starts, q)
    device = model.device
    keep = sorted({r for per_row in inputs.logit_rows for r in per_row})
    logits_to_keep = torch.tensor(keep, dtype=torch.long, device=device)
    adapters = [row.adapter for row in rows]
    if fast is not None:
        with lora_rows(model, adapters, slotted=True):
            out = fast(kv, inputs, starts, q, logits_to_keep=logits_to_keep)
    else:
        extents = kv.extents(q)
        mask = batch_masks(model.config, inputs, kv, model.dtype, device)
        with lora_rows(model, adapters):
            out = model(
                input_ids=inputs.input_ids.to(device),
                position_ids=inputs.position_ids.to(device),
                attention_mask=mask,
                **hf_internals.cache_kwargs(model, kv.cache),
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **({"output_hidden_states": True} if layers else {}),
                **({"row_extents": extents} if extents is not None else {}),
                **invariant_kwargs(model, inputs.allowed, inputs.position_ids),
            )
    at = {r: i for i, r in enumerate(keep)}
    features = hf_internals.hidden_features(out, layers) if layers else None  # [b, q, L, H]
    return [
        _row_output(out.logits[b], at, inputs.logit_rows[b], row, features, layers, b)
        for b, row in enumerate(rows)
    ]


def batch_masks(config, inputs: BatchInputs, kv: BatchKV, dtype, device):
    """The `attention_mask` argument: per layer group of `kv` (after `begin`), the 4D additive
    mask [b, 1, q, columns] of what each query row may attend, for window groups narrowed to
    each query's window (`inputs.window_allowed` over the columns' positions)."""
    full = windowed = None
    for i, group in enumerate(kv.groups):  # inputs.allowed is laid out in the first group's
        allowed = (
            inputs.allowed if i == 0 else allowed_in(group.visible, group.starts, inputs.blocks)
        )
        if group.window is None:
            full = additive_mask(allowed, dtype, device)[:, None]
            continue
        key_pos = group.positions(inputs.position_ids)  # [b, columns]
        allowed = window_allowed(allowed, inputs.position_ids, key_pos, group.window)
        windowed = additive_mask(allowed, dtype, device)[:, None]
    return hf_internals.layer_masks(config, full, windowed)


def padded_q(rows: list[BatchRow], pad_width: Callable[[int], int] | None) -> int:
    """Query rows per batch row so that the forward's rows x q lands on a cheap width.

    Example: 2 rows of width 1 and pad_width(2) = 4 -> q 2 (a 4-token forward instead of 2);
    16 rows and pad_width(16) = 20 -> q 1 (no q makes 16 x q equal 20).
    """
    if pad_width is None:
        return 0
    q = max(len(r.pending) + draft_width(r.draft) for r in rows)
    target = pad_width(len(rows) * q)
    return target // len(rows) if target % len(rows) == 0 else q


def _row_output(logits, at, logit_rows, row: BatchRow, features, layers, b) -> ForwardOutput:
    """Row b's view, shaped as `verify_forward` returns it for that request alone."""
    picked = logits[[at[r] for r in logit_rows]]  # [r, vocab]
    n = len(row.draft.tree)
    aux_tokens = greedy_tokens(picked[n + 1 :]) if row.draft.aux else []
    row_features = None
    if row.feature_layers:
        cols = [layers.index(layer) for layer in row.feature_layers]
        row_features = features[b, : len(row.pending) + n][:, cols]  # [p + n, L, H]
    return ForwardOutput(picked[: n + 1], aux_tokens, row_features)
