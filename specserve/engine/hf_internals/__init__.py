"""Every touch of transformers internals lives in this package, pinned by
tests/engine/test_hf_internals.py: the KV caches (`cache`), sliding-window layers (`windows`),
the batched row attention (`attention`) and the target's parts drafters reuse (`backbone`).
"""

from specserve.engine.hf_internals.attention import (
    ROW_ATTENTION,
    UnsupportedAttention,
    enable_row_attention,
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
    GrowingLayer,
    append_row,
    cache_kwargs,
    cache_length,
    empty_cache,
    gather_rows,
    keep_rows,
    kv_bytes,
    make_contiguous,
    new_batch_cache,
    new_cache,
    row_writes,
    set_write_columns,
    write_row,
)
from specserve.engine.hf_internals.windows import (
    WindowLayer,
    layer_masks,
    layer_windows,
    window,
    window_offset,
)

__all__ = [
    "ROW_ATTENTION",
    "GrowingLayer",
    "UnsupportedAttention",
    "WindowLayer",
    "append_row",
    "cache_kwargs",
    "cache_length",
    "decoder_layer",
    "empty_cache",
    "enable_row_attention",
    "final_norm",
    "gather_rows",
    "hidden_features",
    "keep_rows",
    "kv_bytes",
    "layer_forward",
    "layer_masks",
    "layer_type",
    "layer_windows",
    "make_contiguous",
    "new_batch_cache",
    "new_cache",
    "num_layers",
    "rotary",
    "row_writes",
    "set_write_columns",
    "strip_quantizer",
    "window",
    "window_offset",
    "write_row",
]
