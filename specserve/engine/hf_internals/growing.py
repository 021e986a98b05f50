"""A decode batch's KV cache (`GrowingLayer`s: appends in place into spare capacity) and
the row operations on them (`new_batch_cache`, `append_row`, `write_row`, `gather_rows`,
`move_columns`): each batch row writing at its own column.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from specserve.engine.hf_internals.cache import layer_indices
from specserve.engine.hf_internals.growing_layer import GrowingLayer
from specserve.engine.hf_internals.storage_rows import gather_entries
from specserve.engine.hf_internals.windows import WindowLayer, layer_windows


def set_write_columns(
    cache: DynamicCache, columns: list[int] | None, layers: Sequence[int] | None = None
) -> None:
    """The next forward writes batch row b's entries from column columns[b] on (None: all rows
    after the used part), in `layers` (indices; None: all). Only where `row_writes(cache)`."""
    for i in layer_indices(cache, layers):
        cache.layers[i].write_at = columns


def reserve(cache: DynamicCache, end: int) -> None:
    """Every layer has room for `end` columns, which the next forward uses. For a batch cache
    whose rows are in (`append_row`)."""
    for layer in cache.layers:
        layer.reserve(end)


def set_write_index(cache: DynamicCache, index: torch.Tensor | None, used: int = 0) -> None:
    """The next forwards write batch row b's entries at columns index[b] [q] of the reserved
    buffers and attend their first `used` columns (None: back to `write_at` / the used part)."""
    width = None if index is None else torch.empty(0, used, device=index.device)
    for layer in cache.layers:
        layer.write_index, layer.width = index, width


def row_writes(cache: DynamicCache) -> bool:
    """Every layer can write each batch row at its own column."""
    return all(isinstance(layer, GrowingLayer) for layer in cache.layers)


def new_batch_cache(config) -> DynamicCache:
    """A cache for a decode batch: every layer appends in place (`GrowingLayer`); sliding-window
    layers hold all of each row's positions too, and the engine's masks apply the window."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() for _ in layer_windows(config)]
    return cache


@torch.inference_mode()
def append_row(
    cache: DynamicCache,
    row_cache: DynamicCache,
    length: int,
    layers: Sequence[int] | None = None,
    first: int = 0,
) -> None:
    """Add `row_cache`'s positions [first, length) as a new batch row of `cache` (batch 1 there)
    in `layers` (indices; None: all), at columns 0, 1, ...

    Rows are right-padded with zeros to the longer of the two; the caller masks padding out.
    Example: cache [2 rows, 5 positions] + a row of 7 -> [3 rows, 7 positions].
    """
    for i in layer_indices(cache, layers):
        layer = cache.layers[i]
        keys, values = _row_entries(row_cache.layers[i], first, length)
        if not layer.is_initialized or layer.keys.numel() == 0:
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys.clone(), values.clone()
            continue
        width = max(layer.keys.shape[2], keys.shape[2])
        new_keys = torch.cat([_pad_to(layer.keys, width), _pad_to(keys, width)], dim=0)
        new_values = torch.cat([_pad_to(layer.values, width), _pad_to(values, width)], dim=0)
        layer.keys, layer.values = new_keys, new_values


@torch.inference_mode()
def write_row(
    cache: DynamicCache,
    row: int,
    row_cache: DynamicCache,
    length: int,
    layers: Sequence[int] | None = None,
    first: int = 0,
) -> None:
    """Overwrite batch row `row`'s first columns with `row_cache`'s positions [first, length)
    (batch 1 there) in `layers`, in place; the caller hides the row's other columns. Requires
    length - first <= the cache's columns."""
    for i in layer_indices(cache, layers):
        layer = cache.layers[i]
        keys, values = _row_entries(row_cache.layers[i], first, length)
        layer.keys[row, :, : length - first] = keys[0]
        layer.values[row, :, : length - first] = values[0]


def _row_entries(layer, first: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A request cache layer's positions [first, length) as [1, h, length - first, d] keys and
    values (a `WindowLayer` holds positions from its offset on; asking for older ones raises)."""
    offset = layer.offset if isinstance(layer, WindowLayer) else 0
    if first < offset:
        raise ValueError(f"positions from {first} asked of a window layer holding {offset} on")
    cols = slice(first - offset, length - offset)
    return layer.keys[:, :, cols], layer.values[:, :, cols]


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """[b, h, n, d] -> [b, h, width, d], zeros on the right."""
    extra = width - t.shape[2]
    return t if extra == 0 else torch.nn.functional.pad(t, (0, 0, 0, extra))


@torch.inference_mode()
def gather_rows(
    cache: DynamicCache,
    rows: torch.Tensor,
    columns: torch.Tensor,
    layers: Sequence[int] | None = None,
) -> None:
    """Keep batch rows `rows` [b'] and, for kept row i, columns `columns[i]` [b', n'] in order,
    in `layers` (indices; None: all).

    Example: rows [2, 0], columns [[0, 3], [1, 1]] leaves 2 rows of 2 positions: old row 2's
    positions 0 and 3, then old row 0's position 1 twice (repeats are how callers pad).
    """
    for i in layer_indices(cache, layers):
        layer = cache.layers[i]
        if not layer.is_initialized or layer.keys.numel() == 0:
            continue
        device = layer.keys.device
        r, c = rows.to(device), columns.to(device)
        new_keys = gather_entries(layer.keys, r, c)
        new_values = gather_entries(layer.values, r, c)
        layer.keys, layer.values = new_keys, new_values  # both read before either is replaced


@torch.inference_mode()
def move_columns(
    cache: DynamicCache,
    rows: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    layers: Sequence[int] | None = None,
) -> None:
    """For each i, batch row rows[i]'s entry at column src[i] goes to column dst[i] (all read
    before any is written), in `layers`; one indexed copy per layer, in place. Example: rows
    [0, 0], src [5, 7], dst [4, 5] packs row 0's columns 5 and 7 right after column 3."""
    for i in layer_indices(cache, layers):
        layer = cache.layers[i]
        keys, values = layer.keys, layer.values  # views of the used part: writes land in place
        r, s, d = rows.to(keys.device), src.to(keys.device), dst.to(keys.device)
        keys[r, :, d] = keys[r, :, s]
        values[r, :, d] = values[r, :, s]
