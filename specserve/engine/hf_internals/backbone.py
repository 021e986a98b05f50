"""The target's parts a drafter reuses (decoder-layer class, final norm, rotary tables, hidden
features) and the quantizer marker a GGUF-loaded model carries.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch


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
    """The decoder stack (`LlamaModel`, `GPTNeoXModel` and kin) of a causal LM, unwrapping a
    peft model: the attribute its class names as `base_model_prefix` (`model`, `gpt_neox`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix)


def decoder_layer(model, config=None, layer_idx: int = 0) -> torch.nn.Module:
    """A fresh decoder layer of the target's own class (randomly initialized, eval mode)."""
    layer_type = type(_decoder(model).layers[0])
    return layer_type(config or model.config, layer_idx=layer_idx)


def final_norm(model) -> torch.nn.Module:
    """The norm the target applies before its LM head (`norm`; GPT-NeoX: `final_layer_norm`)."""
    decoder = _decoder(model)
    return decoder.norm if hasattr(decoder, "norm") else decoder.final_layer_norm


def rotary(model, hidden: torch.Tensor, position_ids: torch.Tensor):
    """(cos, sin) position embeddings of the target for `position_ids` [batch, q], as its layer 0
    gets them (Gemma 3 keeps one rotary table per layer type)."""
    emb = _decoder(model).rotary_emb
    if "layer_type" in inspect.signature(emb.forward).parameters:
        return emb(hidden, position_ids, model.config.layer_types[0])
    return emb(hidden, position_ids=position_ids)


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
    """`cache` in newer transformers, `past_key_values` before; GPT-NeoX layers take `layer_past`
    (a name the layer does not list would be swallowed by its **kwargs and the cache unused)."""
    params = inspect.signature(layer_type.forward).parameters
    names = [name for name in ("cache", "past_key_values", "layer_past") if name in params]
    if not names:
        raise ValueError(f"{layer_type.__name__}.forward takes no cache argument")
    return names[0]
