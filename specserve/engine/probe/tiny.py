"""A model config shrunk to a tiny one of the same architecture: same config class and model
class, few layers and small widths, the attention features kept (layer kinds, sliding window
made short, soft-capping, partial rotary, fused projections, tied embeddings, MoE routing).
"""

from __future__ import annotations

import copy
import hashlib
import json

import torch
from transformers import AutoModelForCausalLM

VOCAB = 96  # every probe prompt draws ids below this
WINDOW = 8  # a sliding window shorter than the probe's prompts, so it is exercised
HIDDEN, HEADS, HEAD_DIM = 64, 4, 16
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")

# key -> tiny value, applied wherever the config (or a sub-config) holds a non-None value
SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "model_dim"), HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads"), HEADS),
    **dict.fromkeys(("head_dim", "attention_head_dim", "kv_channels"), HEAD_DIM),
    **dict.fromkeys(
        ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "intermediate_size_mlp"),
        128,
    ),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k"), 2),
    **dict.fromkeys(("n_group", "topk_group", "first_k_dense_replace"), 1),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), 8),
    **dict.fromkeys(("v_head_dim", "qk_head_dim"), HEAD_DIM),
    **dict.fromkeys(("vocab_size", "text_vocab_size"), VOCAB),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), 256),
    **dict.fromkeys(("state_size", "ssm_state_size", "time_step_rank", "mamba_d_state"), 8),
}
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
WINDOWS = ("sliding_window", "attention_window_size", "window_size")
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}


def tiny_config(config):
    """A copy of `config` shrunk (see module docstring); everything not sized here as the config
    has it. Raises what the config class raises for a combination it refuses."""
    data = _shrink(config.to_dict())
    for key in ("_name_or_path", "architectures", "auto_map", "transformers_version"):
        data.pop(key, None)
    return type(config).from_dict(data)


def _shrink(data: dict) -> dict:
    data = copy.deepcopy(data)
    layers = next((data[k] for k in LAYER_KEYS if isinstance(data.get(k), int)), None)
    keep = _kept_layers(data, layers) if layers else None
    for key, value in list(data.items()):
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            data[key] = _shrink(value)
        elif key in LAYER_KEYS and isinstance(value, int):
            data[key] = len(keep)
        elif keep and isinstance(value, list) and len(value) == layers:
            data[key] = [value[i] for i in keep]  # per-layer lists: the kept layers' entries
        elif key == "head_dim" and isinstance(data.get("qk_rope_head_dim"), int):
            data[key] = SIZES["qk_rope_head_dim"]  # multi-head latent attention: the rotary part
        elif key in SIZES and isinstance(value, int) and not isinstance(value, bool):
            data[key] = SIZES[key]
        elif key in KV_HEADS and isinstance(value, int):
            heads = _first(data, ("num_attention_heads", "n_head", "n_heads", "num_heads"))
            data[key] = 1 if value == 1 else (HEADS if heads and value >= heads else 2)
        elif key in WINDOWS and isinstance(value, int) and not isinstance(value, bool):
            data[key] = WINDOW
        elif key in TOKEN_IDS and value is not None:  # within the vocabulary (probes ignore eos)
            data[key] = [TOKEN_IDS[key]] if isinstance(value, list) else TOKEN_IDS[key]
    return data


def _first(data: dict, keys: tuple[str, ...]):
    return next((data[k] for k in keys if data.get(k) is not None), None)


def _kept_layers(data: dict, layers: int) -> list[int]:
    """Indices of the layers the tiny model keeps: the first layer of every kind in
    `layer_types` (so a hybrid keeps each kind), at least two."""
    kinds = data.get("layer_types")
    first: dict = {}
    if isinstance(kinds, list) and len(kinds) == layers:
        for i, kind in enumerate(kinds):
            first.setdefault(json.dumps(kind), i)
    keep = sorted(first.values())
    for i in range(layers):
        if len(keep) >= 2:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def fingerprint(config) -> str:
    """A short digest of the tiny config: same architecture and attention features, same digest,
    whatever the real model's sizes."""
    data = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


def build(config, seed: int = 0):
    """The tiny config's causal LM (transformers' Auto class, random weights), fp32, eval,
    gradients off. The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.requires_grad_(False)
    return model
