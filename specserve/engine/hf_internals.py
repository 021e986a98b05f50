"""Every touch of transformers internals lives here, pinned by tests/engine/test_hf_internals.py:
the KV cache (one entry per committed position; `keep_rows` keeps the accepted nodes' entries and
drops the rest) and the quantizer marker a GGUF-loaded model carries.
"""

from __future__ import annotations

import contextlib
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


def strip_quantizer(model) -> None:
    """Turn a dequantized GGUF-loaded model into a plain one (savable, castable).

    transformers refuses save_pretrained while `hf_quantizer` is set, and a saved
    `quantization_config` (quant_method gguf) would make the reload go through the GGUF quantizer.
    """
    for attr in ("hf_quantizer", "quantization_method", "_weight_conversions"):
        if attr in model.__dict__:
            delattr(model, attr)
        elif hasattr(model, attr):
            with contextlib.suppress(AttributeError):
                setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        with contextlib.suppress(AttributeError):
            model.is_quantized = False
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        with contextlib.suppress(AttributeError):
            delattr(cfg, "quantization_config")
    if getattr(cfg, "_is_quantized", False):
        cfg._is_quantized = False
