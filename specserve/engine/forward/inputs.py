"""The inputs of a target forward over [pending tokens | draft tree | aux branch]: query rows,
their positions, what each may attend (`build_inputs`), and the 4D additive masks and
position-invariant layout the model takes for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.engine import hf_internals
from specserve.engine.tree import Draft


@dataclass(frozen=True)
class ForwardInputs:
    input_ids: torch.Tensor  # [1, q]
    position_ids: torch.Tensor  # [1, q]
    allowed: torch.Tensor  # [q, past + q] bool
    logit_rows: torch.Tensor  # [r]


def build_inputs(past: int, pending: list[int], draft: Draft, pad_to: int = 0) -> ForwardInputs:
    """Lay out the query rows and what each may attend to; pad with inert rows up to `pad_to`.

    Example: past 3, pending [a, b], tree [x] (child of root) and no aux: ids [a, b, x] at
    positions [3, 4, 5]; x attends to the 3 cached positions, a, b and itself; logit rows [1, 2].
    A padding row holds token 0, sees the cache and itself, and is never read (its cache entry is
    dropped by the commit).
    """
    tree, aux = draft.tree, draft.aux
    p, n, a = len(pending), len(tree), len(aux) if aux else 0
    used = p + n + a
    q = max(used, pad_to)
    root_pos = past + p - 1
    allowed = torch.zeros(q, past + q, dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:used, past : past + p] = _pending_block(p, used)
    allowed[p : p + n, past + p : past + p + n] = tree.ancestor_mask()
    positions = list(range(past, past + p)) + [root_pos + d for d in tree.depths]
    rows = list(range(p - 1, p + n))
    ids = list(pending) + list(tree.tokens)
    if aux:
        allowed[p + n : used, past + p + n : past + used] = aux.visible
        positions += [root_pos + o for o in aux.offsets]
        rows += [p + n + r for r in aux.logit_rows]
        ids += list(aux.tokens)
    for row in range(used, q):
        allowed[row, past + row] = True
    ids += [0] * (q - used)
    positions += [root_pos] * (q - used)
    return ForwardInputs(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        allowed=allowed,
        logit_rows=torch.tensor(rows, dtype=torch.long),
    )


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """The 4D-mask values of a boolean layout: 0 where a query row may attend, the dtype's
    minimum elsewhere (same shape as `allowed`). Example: [[True, False]] in float32 ->
    [[0.0, -3.4028e38]]."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed.to(device), torch.finfo(dtype).min)


def window_allowed(
    allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, window: int
) -> torch.Tensor:
    """`allowed` [..., q, k] narrowed to a sliding window: a query at position p keeps only keys
    at positions > p - window (transformers' rule). `query_pos` [..., q], `key_pos` [..., k].
    Example: window 2, query_pos [3], key_pos [1, 2, 3], allowed [[T, T, T]] -> [[F, T, T]]."""
    near = query_pos[..., :, None] - key_pos[..., None, :] < window  # [..., q, k]
    return allowed & near


def attention_masks(config, inputs: ForwardInputs, past: int, offset: int, dtype, device):
    """The `attention_mask` argument for a multi-row forward: the 4D additive mask
    [1, 1, q, past + q] of `inputs` for full-attention layers, and for sliding-window layers
    (whose cache holds positions from `offset` on) the same narrowed to the window,
    [1, 1, q, past - offset + q]; only the kinds the model has are built."""
    windows = hf_internals.layer_windows(config)
    full = None if all(windows) else additive_mask(inputs.allowed, dtype, device)[None, None]
    window = hf_internals.window(config)
    if window is None:
        return full
    query_pos = inputs.position_ids[0]  # [q]
    key_pos = torch.cat([torch.arange(offset, past), query_pos])  # [past - offset + q]
    allowed = window_allowed(inputs.allowed[:, offset:], query_pos, key_pos, window)
    windowed = additive_mask(allowed, dtype, device)[None, None]
    return hf_internals.layer_masks(config, full, windowed)


def _pending_block(p: int, q: int) -> torch.Tensor:
    """[q, p]: pending rows are causal among themselves; all later rows see every pending token."""
    block = torch.ones(q, p, dtype=torch.bool)
    block[:p] = torch.ones(p, p, dtype=torch.bool).tril()
    return block


def invariant_kwargs(model, allowed: torch.Tensor, positions: torch.Tensor) -> dict:
    """The forward keyword of the position-invariant attention for query rows at `positions`
    [b, q] attending the key columns `allowed` [b, q, columns] marks, where the model serves it
    (`invariance.apply`); {} otherwise."""
    if not hf_internals.is_invariant(model):
        return {}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    group = config.num_attention_heads // (config.num_key_value_heads or config.num_attention_heads)
    layout = hf_internals.invariant_layout(allowed, positions, group, model.dtype, model.device)
    return {"invariant_layout": layout}
