"""Names shared by every LoRA path: `BASE_ADAPTER` (a row with no adapter) and peft detection.

Rows name their adapter; `lora_batch.lora_rows` applies them (through a model's `LoRAStore` or a
peft model's own layers), so concurrent requests never race on peft's "active adapter".
"""

from __future__ import annotations

BASE_ADAPTER = "__base__"  # a row with no adapter (peft's name for it in a mixed batch)


def is_peft_model(model) -> bool:
    """True for a peft wrapper (it owns the injected LoRA layers and routes `adapter_names`)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")
