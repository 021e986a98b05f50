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


# --- hidden features and the base model's parts a drafter reuses (pinned by the same test) ---


def num_layers(model) -> int:
    """Decoder layers of the target."""
    return int(model.config.num_hidden_layers)


def hidden_features(out, layers: tuple[int, ...]) -> torch.Tensor:
    """[batch, q, len(layers), hidden] from a forward run with `output_hidden_states=True`.

    Layer index i in 0..L-2 is the output of decoder layer i (the pre-norm residual stream);
    -1 is the final normed hidden state, the LM head's input. transformers gives L + 1 states
    (embeddings first) and replaces the last layer's output by the normed one, so i maps to
    state i + 1 and the last layer's pre-norm output is not available.
    """
    states = out.hidden_states
    last = len(states) - 2  # index of the last decoder layer whose own output is kept
    for i in layers:
        if i != -1 and not 0 <= i < last:
            raise ValueError(f"feature layer {i}: valid are -1 and 0..{last - 1}")
    picked = [states[-1] if i == -1 else states[i + 1] for i in layers]
    return torch.stack(picked, dim=2)


def _decoder(model):
    """The decoder stack (`LlamaModel` and kin) of a causal LM, unwrapping a peft model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def decoder_layer(model, config=None, layer_idx: int = 0) -> torch.nn.Module:
    """A fresh decoder layer of the target's own class (randomly initialized, eval mode)."""
    layer_type = type(_decoder(model).layers[0])
    return layer_type(config or model.config, layer_idx=layer_idx)


def final_norm(model) -> torch.nn.Module:
    """The norm the target applies before its LM head."""
    return _decoder(model).norm


def rotary(model, hidden: torch.Tensor, position_ids: torch.Tensor):
    """(cos, sin) position embeddings of the target for `position_ids` [batch, q]."""
    return _decoder(model).rotary_emb(hidden, position_ids=position_ids)


def layer_forward(layer, hidden, mask, position_ids, cache, position_embeddings) -> torch.Tensor:
    """One decoder layer over hidden [batch, q, H] with a 4D additive mask and an optional cache
    (its entries go to cache layer 0). Returns the layer's output hidden [batch, q, H]."""
    out = layer(
        hidden,
        attention_mask=mask,
        position_ids=position_ids,
        **({_layer_cache_keyword(type(layer)): cache} if cache is not None else {}),
        use_cache=cache is not None,
        position_embeddings=position_embeddings,
    )
    return out[0] if isinstance(out, tuple) else out


@functools.cache
def _layer_cache_keyword(layer_type: type) -> str:
    params = inspect.signature(layer_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def empty_cache() -> DynamicCache:
    """A cache with no preset layers (grows as layers write to it); for a drafter's own layer."""
    return DynamicCache()
