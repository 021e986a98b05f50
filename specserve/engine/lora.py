"""Which LoRA adapter a forward applies: the keyword a peft-wrapped model takes per row.

A peft model with several resident adapters serves every row through `adapter_names`
(`BASE_ADAPTER` = no adapter), so concurrent requests never race on peft's "active adapter".
"""

from __future__ import annotations

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch


def is_peft_model(model) -> bool:
    """True for a peft wrapper (it owns the injected LoRA layers and routes `adapter_names`)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_kwargs(model, adapters: list[str | None]) -> dict:
    """Forward keywords selecting one adapter per batch row.

    A name selects that resident adapter, `BASE_ADAPTER` the base model alone; None leaves the
    model's default (a plain model, or a peft model's active adapter) when every row says None,
    and means the base when mixed with names. Examples: a peft model and ["support@2", None]
    -> {"adapter_names": ["support@2", "__base__"]}; any model and [None] -> {}. A named adapter
    on a plain model, or one the peft model does not hold, raises ValueError listing what is
    resident.
    """
    if all(a is None for a in adapters):
        return {}
    if not is_peft_model(model):
        if any(a not in (None, BASE_ADAPTER) for a in adapters):
            raise ValueError(
                f"adapter: {adapters} requested but the model has no LoRA adapters loaded"
            )
        return {}
    resident = set(model.peft_config)
    unknown = sorted({a for a in adapters if a not in (None, BASE_ADAPTER) and a not in resident})
    if unknown:
        raise ValueError(f"adapter: {unknown} not resident; resident adapters: {sorted(resident)}")
    return {"adapter_names": [BASE_ADAPTER if a is None else a for a in adapters]}
