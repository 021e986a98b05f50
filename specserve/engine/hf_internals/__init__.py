"""Every touch of transformers internals lives in this package, pinned by
tests/engine/test_hf_internals.py: the KV caches (`cache`; a batch's layers: `growing`),
sliding-window layers (`windows`), the batched row attention (`attention`), the
position-invariant attention (`invariant`) and the target's parts drafters reuse (`backbone`).
"""

from specserve.engine.hf_internals.attention import (
    ROW_ATTENTION,
    UnsupportedAttention,
    disable_invariant,
    enable_invariant,
    enable_row_attention,
    is_invariant,
    layer_type,
)
from specserve.engine.hf_internals.backbone import (
    decoder_layer,
    final_norm,
    hidden_features,
    layer_forward,
    num_layers,
    rotary,
    strip_quantizer,
)
from specserve.engine.hf_internals.cache import (
    cache_kwargs,
    cache_length,
    copy_cache,
    empty_cache,
    keep_rows,
    kv_bytes,
    make_contiguous,
    new_cache,
)
from specserve.engine.hf_internals.growing import (
    append_row,
    gather_rows,
    move_columns,
    new_batch_cache,
    reserve,
    row_writes,
    set_write_columns,
    set_write_index,
    write_row,
)
from specserve.engine.hf_internals.growing_layer import GrowingLayer
from specserve.engine.hf_internals.invariant import flash_attention, invariant_attention
from specserve.engine.hf_internals.invariant_plan import DEPTH, DraftTooDeep, InvariantLayout
from specserve.engine.hf_internals.invariant_plan import layout as invariant_layout
from specserve.engine.hf_internals.windows import (
    WindowLayer,
    layer_masks,
    layer_windows,
    window,
    window_offset,
)

__all__ = [
    "DEPTH",
    "ROW_ATTENTION",
    "DraftTooDeep",
    "GrowingLayer",
    "InvariantLayout",
    "UnsupportedAttention",
    "WindowLayer",
    "append_row",
    "cache_kwargs",
    "cache_length",
    "copy_cache",
    "decoder_layer",
    "disable_invariant",
    "empty_cache",
    "enable_invariant",
    "enable_row_attention",
    "final_norm",
    "flash_attention",
    "gather_rows",
    "hidden_features",
    "invariant_attention",
    "invariant_layout",
    "is_invariant",
    "keep_rows",
    "kv_bytes",
    "layer_forward",
    "layer_masks",
    "layer_type",
    "layer_windows",
    "make_contiguous",
    "move_columns",
    "new_batch_cache",
    "new_cache",
    "num_layers",
    "reserve",
    "rotary",
    "row_writes",
    "set_write_columns",
    "set_write_index",
    "strip_quantizer",
    "window",
    "window_offset",
    "write_row",
]
