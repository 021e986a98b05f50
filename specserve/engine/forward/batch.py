"""One forward of the target over many requests: row b = [its pending tokens | its draft], padded.

Each row has its own positions, LoRA adapter and tree mask; the past it sees is the columns its
`BatchKV` row holds, and its new entries go where `BatchKV.begin` says (ragged: after its own).
The output is one `ForwardOutput` per row, exactly what `verify_forward` gives that request
alone, so the one verifier and commit serve batched and single requests alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specserve.engine.forward import compiled_batch
from specserve.engine.forward.batch_cache import BatchKV
from specserve.engine.forward.batch_rows import BatchRow, batch_width, padded_q, run_rows
from specserve.engine.forward.single import ForwardOutput


@torch.inference_mode()
def verify_batch_forward(
    model,
    kv: BatchKV,
    rows: list[BatchRow],
    pad_width: Callable[[int], int] | None = None,
    compiled: bool = True,
) -> list[ForwardOutput]:
    """Run the target once over every row of `kv` (rows[b] is kv row b); each row gets q new
    columns, all hidden until the commit keeps the accepted ones (`BatchKV.keep`).
    `pad_width(k)`: the device's cheapest width >= k tokens; rows are padded so that rows x q
    reaches it (on CPU a [2, 2] forward costs less than a [2, 1] one). The call goes to the
    model's warm compiled batched forward (`engine.forward.compiled_batch`) where it can, unless
    `compiled` is False."""
    if len(rows) != kv.rows:
        raise ValueError(f"{len(rows)} inputs for a batch cache of {kv.rows} rows")
    q = batch_width(rows, padded_q(rows, pad_width))
    features = any(row.feature_layers for row in rows)
    fast = compiled_batch.runner(model, kv, features) if compiled else None
    return run_rows(model, kv, rows, q, fast)
