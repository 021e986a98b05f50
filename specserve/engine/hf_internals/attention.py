"""The row-wise attention registered with transformers' `AttentionInterface` for batches:
each row attends its own key columns only; keywords it does not implement raise.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from specserve.engine.hf_internals.cache import layer_windows
from specserve.engine.hf_internals.invariant import invariant_attention

ROW_ATTENTION = "specserve_rows"


class UnsupportedAttention(ValueError):
    """A layer asked the row attention for a feature it does not implement."""


# what the row attention receives and honours: the sdpa arguments; `sliding_window` (every mask
# it gets has the window applied: the engine's own, or transformers' where the model built it;
# none only where the window cannot bind); the layer's bookkeeping it has no use for.
_ATTENTION_KWARGS = frozenset(
    {
        "dropout",
        "scaling",
        "is_causal",
        "sliding_window",
        "position_ids",
        "use_cache",
        "output_hidden_states",
        "output_router_logits",  # the MoE block's flag, forwarded through the layer's kwargs
    }
)
_OFF_FLAGS = frozenset({"output_attentions"})  # honoured while off: no weights are asked for


def _check_attention_kwargs(module, kwargs: dict) -> None:
    """Raise for any keyword the row attention would otherwise drop (soft-capping, sinks...)."""
    unknown = sorted(
        k
        for k, v in kwargs.items()
        if k not in _ATTENTION_KWARGS and v is not None and not (k in _OFF_FLAGS and v is False)
    )
    if unknown:
        raise UnsupportedAttention(
            f"{type(module).__name__} passes {', '.join(unknown)} to the attention function; "
            f"the engine's row attention does not implement it (it handles "
            f"{', '.join(sorted(_ATTENTION_KWARGS))})"
        )


def _row_attention(
    module, query, key, value, attention_mask, row_extents=None, invariant_layout=None, **kwargs
):
    """transformers' sdpa without a mask. With one (query [b, heads, q, d], key/value
    [b, kv_heads, columns, d], mask [b, 1, q, columns]) and given `row_extents`, each batch row
    attends its own key columns [0, e_b) only, so short rows skip the long rows' padding; on CPU
    through torch's sdpa with grouped-query heads (transformers would copy every key/value head
    group there), elsewhere through transformers' sdpa. Returns ([b, q, heads, d], None).
    `row_extents` may be {layer type: extents} when the layer groups have their own columns.
    With `invariant_layout` (`invariant_plan.layout`) it is the position-invariant attention instead.
    Keywords outside `_ATTENTION_KWARGS` raise `UnsupportedAttention`, never pass silently."""
    _check_attention_kwargs(module, kwargs)
    if invariant_layout is not None:
        out = invariant_attention(
            module, query, key, value, invariant_layout, kwargs.get("scaling")
        )
        return out, None
    if isinstance(row_extents, dict):  # one list per layer type (`BatchKV.extents`)
        row_extents = row_extents[layer_type(module)]
    if attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)
    attend = _grouped_sdpa if query.device.type == "cpu" else _transformers_sdpa
    if row_extents is None:
        return attend(module, query, key, value, attention_mask, **kwargs), None
    outs = [
        attend(
            module,
            query[b : b + 1],
            key[b : b + 1, :, :e],
            value[b : b + 1, :, :e],
            attention_mask[b : b + 1, :, :, :e],
            **kwargs,
        )
        for b, e in enumerate(row_extents)
    ]
    return torch.cat(outs), None


def layer_type(attention) -> str:
    """ "sliding_attention" or "full_attention": the kind of the layer an attention module is
    in (from its config and `layer_idx`, as every transformers attention module has them)."""
    windowed = layer_windows(attention.config)[attention.layer_idx] is not None
    return "sliding_attention" if windowed else "full_attention"


def _grouped_sdpa(module, query, key, value, mask, scaling=None, dropout=0.0, **_) -> torch.Tensor:
    """torch's sdpa with grouped-query heads, [b, q, heads, d] (the caller checked the other
    keywords, see `_check_attention_kwargs`; a mask is always given here, so `is_causal` is moot)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=_grouped(module, query, key),
    )
    return out.transpose(1, 2).contiguous()


def _grouped(module, query, key) -> bool:
    """Whether key/value heads are shared by query heads: from the module's
    `num_key_value_groups` where it has one (a plain bool even in a compiled forward, where the
    shapes are symbolic), else from the shapes."""
    groups = getattr(module, "num_key_value_groups", None)
    return groups != 1 if isinstance(groups, int) else query.shape[1] != key.shape[1]


def _transformers_sdpa(module, query, key, value, mask, **kwargs) -> torch.Tensor:
    """transformers' sdpa (its kernel choice for CUDA and others), [b, q, heads, d]."""
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)[0]


def enable_row_attention(model) -> bool:
    """Switch an sdpa model to `ROW_ATTENTION` (sdpa unless a forward passes `row_extents`);
    False (and nothing changed) for other attention implementations."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.config._attn_implementation == ROW_ATTENTION:
        return True
    if base.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(ROW_ATTENTION, _row_attention)
    AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)
    base.set_attn_implementation(ROW_ATTENTION)
    return base.config._attn_implementation == ROW_ATTENTION


def enable_invariant(model) -> None:
    """Serve `model` with the position-invariant attention (the row attention's invariant mode,
    see `invariant`): its forwards then pass an `invariant_layout`."""
    if not enable_row_attention(model):
        raise UnsupportedAttention("the invariant attention replaces sdpa only")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.specserve_invariant = True


def is_invariant(model) -> bool:
    """Whether `enable_invariant` switched this model (its forwards then pass a layout)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base.config, "specserve_invariant", False))


def disable_invariant(model) -> None:
    """Back to the row attention's plain sdpa path (linears keep their row tiles)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.specserve_invariant = False
