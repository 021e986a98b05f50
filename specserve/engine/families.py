"""The model families the engine serves: the hand-kept known-good list (what each is proven on
is THE GATE in tests/engine/test_families.py) and, for any other decoder-only causal LM, the
conformance probe's verdict (`engine.probe`). `family_of` admits or refuses a config at load;
a family's default LoRA targets are found from its modules, not listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from specserve.engine import hf_internals
from specserve.engine.probe import lora_targets, probe

KNOWN_GOOD = "known-good list"
BY_PROBE = "admitted by probe"


class Family(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_type: str  # the config's `model_type`
    name: str  # how users know it
    # a finetune's default target modules: the attention projections found in the model
    lora_targets: tuple[str, ...] = ()
    features: tuple[str, ...] = ()  # attention features the engine handles for it
    admitted: Literal["known-good list", "admitted by probe"] = KNOWN_GOOD
    reason: str = ""  # the probe's verdict, for a family it admitted


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
            features=("fused qkv / gate_up projections", "sliding window"),
        ),
        Family(model_type="olmo2", name="OLMo 2"),
        Family(
            model_type="gpt_neox",
            name="GPT-NeoX, Pythia",
            features=("fused query_key_value", "partial rotary"),
        ),
    )
}


class UnsupportedModel(ValueError):
    """The architecture is neither known-good nor admitted by the probe (or it uses a feature
    the engine refuses); the message says which check refused it."""


def family_of(config, cache_dir: Path | None = None) -> Family:
    """The family of a model config, with its LoRA targets found; raises UnsupportedModel.
    A `model_type` in FAMILIES is known-good; any other runs the conformance probe (kept under
    `cache_dir`, else in this process). Example: a LlamaConfig -> FAMILIES["llama"] with
    lora_targets (q_proj, k_proj, v_proj, o_proj); a Starcoder2Config -> a Family admitted by
    probe; a T5Config -> UnsupportedModel (encoder-decoder)."""
    model_type = getattr(config, "model_type", None)
    listed = FAMILIES.get(model_type)
    if listed is not None:
        try:
            hf_internals.layer_windows(config)
        except ValueError as e:
            raise UnsupportedModel(f"{listed.name}: {e}") from e
        return listed.model_copy(update={"lora_targets": lora_targets(config)})
    result = probe(config, cache_dir)
    if not result.admitted:
        assert result.failure is not None
        raise UnsupportedModel(
            f"model type {model_type!r} ({result.architecture}) is not in the known-good list "
            f"({', '.join(FAMILIES)}) and the conformance probe refused it: "
            f"{result.failure.describe()}"
        )
    try:
        hf_internals.layer_windows(config)  # the real model's windows, not only the tiny one's
    except ValueError as e:
        raise UnsupportedModel(f"{result.architecture}: {e}") from e
    return Family(
        model_type=str(model_type),
        name=result.architecture,
        lora_targets=tuple(result.lora_targets),
        admitted=BY_PROBE,
        reason=result.reason(),
    )
