"""A validated adapter's bytes as store tensors: {module: (A [r, in], B x scaling [out, r])}.

Scaling follows peft's rules (lora_alpha / r, or / sqrt(r) with use_rslora; rank_pattern and
alpha_pattern matched as peft matches them); config features that change the computation beyond
plain LoRA are refused. Weights are held in float32 over a 16-bit base (peft's adapter upcast).
"""

from __future__ import annotations

import math
import re

import safetensors.torch
import torch

from specserve.adapters.errors import CorruptAdapterError, UnsupportedAdapterError
from specserve.adapters.validate import ValidatedAdapter, module_of_key
from specserve.engine.lora.store import store_dtype  # noqa: F401 (re-exported: the rule's home)

# config keys that would change what the adapter computes; plain LoRA serves none of them
_REFUSED = (
    "use_dora",
    "lora_bias",
    "fan_in_fan_out",
    "target_parameters",
    "alora_invocation_tokens",
    "arrow_config",
    "modules_to_save",
    "layer_replication",
    "trainable_token_indices",
)


def pattern_value(patterns: dict, module: str, default):
    """peft's `get_pattern_key` rule: the first key K with module matching `(.*\\.)?K$`.
    Example: ({"q_proj": 16}, "model.layers.0.self_attn.q_proj", 8) -> 16."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def scaling_of(config: dict, module: str) -> float:
    """The factor peft multiplies a module's B @ A by. Example: r 8, lora_alpha 16 -> 2.0."""
    rank = pattern_value(config.get("rank_pattern") or {}, module, config.get("r", 8))
    alpha = pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", 8))
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def adapter_tensors(
    adapter: ValidatedAdapter, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module name: (A [r, in], B x scaling [out, r])} in `dtype` on `device`."""
    config = adapter.config
    for key in _REFUSED:
        if config.get(key):
            raise UnsupportedAdapterError(f"adapter config {key}={config[key]!r} is not served")
    state = safetensors.torch.load(adapter.weights)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        module, part = module_of_key(key)
        parts.setdefault(module, {})[part] = tensor
    out = {}
    for module, pair in parts.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise CorruptAdapterError(
                f"module {module!r} has {sorted(pair)}, needs lora_A and lora_B"
            )
        rank = pattern_value(config.get("rank_pattern") or {}, module, config.get("r", 8))
        if pair["lora_A"].shape[0] != rank:
            raise CorruptAdapterError(
                f"module {module!r}: tensors have rank {pair['lora_A'].shape[0]}, config says {rank}"
            )
        a = pair["lora_A"].to(device=device, dtype=dtype).contiguous()
        b = pair["lora_B"].to(device=device, dtype=dtype) * scaling_of(config, module)
        out[module] = a, b.contiguous()  # B x scaling rounded as peft's layers give it
    return out
