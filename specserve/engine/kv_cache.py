"""Every touch of transformers' KV-cache internals lives here (pinned by tests/engine/test_kv_cache.py).

A cache holds one entry per committed position; after a tree forward, `keep_rows` moves the
accepted nodes' entries into place and drops the rest.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


def new_cache(config) -> DynamicCache:
    """An empty cache for a model with this config."""
    return DynamicCache(config=config)


def cache_length(cache: DynamicCache) -> int:
    """Number of positions held."""
    return cache.get_seq_length()


def cache_kwargs(model, cache: DynamicCache) -> dict:
    """The forward keyword for the cache: `cache` in newer transformers, `past_key_values` before."""
    return {_cache_keyword(type(model)): cache}


@functools.cache
def _cache_keyword(model_type: type) -> str:
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def keep_rows(cache: DynamicCache, start: int, rows: list[int]) -> None:
    """Keep positions [0, start) plus start + r for r in rows (ascending), in that order.

    Example: length 10, start 6, rows [0, 2] leaves length 8 holding positions 0..6 and 8.
    """
    total = cache_length(cache)
    contiguous = rows == list(range(len(rows)))
    if not contiguous:
        src = torch.tensor([start + r for r in rows], dtype=torch.long)
        for layer in cache.layers:
            src_dev = src.to(layer.keys.device)
            dst = slice(start, start + len(rows))
            layer.keys[:, :, dst] = layer.keys.index_select(2, src_dev)
            layer.values[:, :, dst] = layer.values.index_select(2, src_dev)
    drop = total - (start + len(rows))
    if drop > 0:
        cache.crop(-drop)
