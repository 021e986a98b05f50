"""train_drafter end to end on a peft-wrapped tiny target: the manifest records the adapter
fingerprint and the drafter loads for that adapter only."""

from __future__ import annotations

import copy

import pytest

from specserve.engine.drafters.artifact import DrafterMismatchError, load_drafter
from specserve.training.run import DrafterTrainSettings, train_drafter

ADAPTER = "f" * 64


@pytest.fixture(scope="module")
def lora_target(tiny_llama):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(tiny_llama(1, init_range=0.1)), LoraConfig(r=2, target_modules=["q_proj"])
    ).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_train_on_adapter_variant(tmp_path, tiny_llama, lora_target, tiny_hf_tokenizer, kind):
    settings = DrafterTrainSettings(
        kind=kind,
        budget_minutes=0.05,
        prompts=16,
        heldout=2,
        max_new_tokens=8,
        gen_batch=8,
        eval_seconds=0,
        tau_prompts=2,
    )
    drafter = train_drafter(
        lora_target,
        tiny_hf_tokenizer,
        "tiny-lora",
        frozenset({2}),
        tmp_path / kind,
        settings,
        adapter_sha256=ADAPTER,
        data_dir=tmp_path / "data",
    )
    m = drafter.manifest
    assert m.kind == kind and m.adapter_sha256 == ADAPTER and m.base_model_id == "tiny-lora"
    assert m.training["examples"] >= 10 and m.heldout_tau >= 1.0
    assert len(m.accept_rates) == (4 if kind == "medusa" else 6)
    assert load_drafter(tmp_path / kind, lora_target, "tiny-lora", ADAPTER).kind == kind
    with pytest.raises(DrafterMismatchError, match="adapter differs"):
        load_drafter(tmp_path / kind, tiny_llama(1, init_range=0.1), "tiny", None)
