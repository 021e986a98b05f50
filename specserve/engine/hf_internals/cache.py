"""The KV caches the engine runs on: a request's own (`new_cache`: one entry per committed
position; `keep_rows` keeps the accepted nodes' entries and drops the rest; `WindowLayer` rolls
back sliding-window layers) and what every cache answers (length, bytes, the forward keyword);
a batch's layers are in `growing`.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from specserve.engine.hf_internals.growing_layer import GrowingLayer
from specserve.engine.hf_internals.windows import WindowLayer, layer_windows


def new_cache(config, growing: bool = False) -> DynamicCache:
    """An empty cache for a model with this config; its sliding-window layers are `WindowLayer`s
    (they can roll back a rejected draft and keep only what a later query can see). `growing`:
    its full-attention layers append in place (`GrowingLayer`) instead of concatenating, which
    copies every entry each forward; for eager forwards (a compiled one guards on the layout)."""
    cache = DynamicCache(config=config)
    cache.layers = [
        WindowLayer(window) if window else GrowingLayer() if growing else layer
        for layer, window in zip(cache.layers, layer_windows(config), strict=True)
    ]
    return cache


def copy_cache(cache: DynamicCache) -> DynamicCache:
    """An independent copy (its own tensors): a prompt prefilled once, decoded by several."""
    return copy.deepcopy(cache)


def cache_length(cache: DynamicCache) -> int:
    """Number of positions held."""
    return cache.get_seq_length()


def cache_kwargs(model, cache: DynamicCache) -> dict:
    """The forward keyword for the cache: `cache` in newer transformers, `past_key_values` before."""
    owner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrapper
    return {_cache_keyword(type(owner)): cache}


@functools.cache
def _cache_keyword(model_type: type) -> str:
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def keep_rows(cache: DynamicCache, start: int, rows: list[int]) -> None:
    """Keep positions [0, start) plus start + r for r in rows (ascending), in that order.

    Example: length 10, start 6, rows [0, 2] leaves length 8 holding positions 0..6 and 8.
    A `WindowLayer` then drops what no later query can see (all but its last window - 1).
    """
    total = cache_length(cache)
    contiguous = rows == list(range(len(rows)))
    for layer in cache.layers:
        offset = layer.offset if isinstance(layer, WindowLayer) else 0  # column = position - offset
        if not contiguous:
            src = torch.tensor([start + r - offset for r in rows], device=layer.keys.device)
            dst = slice(start - offset, start - offset + len(rows))
            layer.keys[:, :, dst] = layer.keys.index_select(2, src)
            layer.values[:, :, dst] = layer.values.index_select(2, src)
        drop = total - (start + len(rows))
        if drop > 0:
            layer.crop(-drop)
        if isinstance(layer, WindowLayer):
            layer.trim()


def kv_bytes(cache: DynamicCache, layers: Sequence[int] | None = None) -> int:
    """Bytes of memory the keys and values of `layers` (indices; None: all) occupy, counting
    whole allocations (a `GrowingLayer`'s spare capacity, the storage a trimmed view keeps)."""
    storages = {}
    for i in layer_indices(cache, layers):
        layer = cache.layers[i]
        for t in (layer.keys, layer.values):
            if t is not None and t.numel():
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@torch.inference_mode()
def make_contiguous(cache: DynamicCache) -> None:
    """Copy each layer's entries that a crop left as a strided view into their own storage, so
    a compiled forward (whose guards pin the strides) sees one layout. Example: after
    `keep_rows` dropped 3 of 10 positions, keys [b, h, 7, d] with stride h * 10 * d -> h * 7 * d.
    """
    for layer in cache.layers:
        if layer.keys is not None and not layer.keys.is_contiguous():
            layer.keys = layer.keys.contiguous()
        if layer.values is not None and not layer.values.is_contiguous():
            layer.values = layer.values.contiguous()


def layer_indices(cache: DynamicCache, layers: Sequence[int] | None) -> Sequence[int]:
    return range(len(cache.layers)) if layers is None else layers


def empty_cache() -> DynamicCache:
    """A cache with no preset layers (grows as layers write to it); for a drafter's own layer."""
    return DynamicCache()
