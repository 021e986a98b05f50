"""The model families the engine serves, in one place: which `model_type`s load, the LoRA
projections a finetune targets by default on each, and the check that refuses anything else at
load. What each family is proven on is THE GATE in tests/engine/test_families.py.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from specserve.engine import hf_internals

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


class Family(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_type: str  # the config's `model_type`
    name: str  # how users know it
    lora_targets: tuple[str, ...] = ATTENTION  # a finetune's default target modules
    features: tuple[str, ...] = ()  # attention features the engine handles for it


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(model_type="llama", name="Llama 2/3, SmolLM"),
        Family(model_type="qwen2", name="Qwen2 / Qwen2.5"),
        Family(model_type="qwen3", name="Qwen3"),
        Family(model_type="mistral", name="Mistral", features=("sliding window",)),
        Family(
            model_type="gemma2",
            name="Gemma 2",
            features=("hybrid sliding window", "attention and final soft-capping"),
        ),
        Family(
            model_type="gemma3_text", name="Gemma 3 (text)", features=("hybrid sliding window",)
        ),
        Family(
            model_type="phi3",
            name="Phi-3",
            lora_targets=("qkv_proj", "o_proj"),
            features=("fused qkv / gate_up projections", "sliding window"),
        ),
        Family(model_type="olmo2", name="OLMo 2"),
        Family(
            model_type="gpt_neox",
            name="GPT-NeoX, Pythia",
            lora_targets=("query_key_value", "dense"),
            features=("fused query_key_value", "partial rotary"),
        ),
    )
}


class UnsupportedModel(ValueError):
    """The model's architecture is outside FAMILIES (or uses a feature the engine refuses)."""


def family_of(config) -> Family:
    """The family of a model config; raises UnsupportedModel naming the supported ones.
    Example: a LlamaConfig -> FAMILIES["llama"]; a T5Config -> UnsupportedModel."""
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        raise UnsupportedModel(
            f"model type {getattr(config, 'model_type', None)!r} is not supported; supported: "
            f"{', '.join(f'{f.model_type} ({f.name})' for f in FAMILIES.values())}"
        )
    try:
        hf_internals.layer_windows(config)
    except ValueError as e:
        raise UnsupportedModel(f"{family.name}: {e}") from e
    return family
