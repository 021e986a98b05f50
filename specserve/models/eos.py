"""End-of-sequence token ids: HF configs give them as an int, a list, a tensor or None;
`id_list` reads any of those, `eos_ids` collects a loaded model's from config and tokenizer."""

from __future__ import annotations

from typing import Any

import torch


def id_list(value: Any) -> list[int]:
    """Token ids of a config value. Example: 2 -> [2]; [2, None, 5] -> [2, 5]; None -> []."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [int(v) for v in value if v is not None]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return []


def eos_ids(model, tokenizer) -> frozenset[int]:
    """Every eos id the generation config, the model config and the tokenizer name."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        ids.update(id_list(gen.eos_token_id))
    ids.update(id_list(getattr(model.config, "eos_token_id", None)))
    ids.update(id_list(getattr(tokenizer, "eos_token_id", None)))
    return frozenset(ids)
