"""Drafter artifacts: round trip, the weights fingerprint, and refusal of a drafter trained for
another base model or another adapter (clear errors naming what differs)."""

from __future__ import annotations

import json

import pytest
import torch

from specserve.engine.drafters.artifact import (
    DrafterMismatchError,
    Manifest,
    base_weights_sha256,
    load_drafter,
    read_manifest,
    save_drafter,
)
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec


def _save(tmp_path, model, drafter, adapter=None):
    manifest = drafter.manifest.model_copy(
        update={"base_weights_sha256": base_weights_sha256(model), "adapter_sha256": adapter}
    )
    return save_drafter(tmp_path / drafter.kind, manifest, drafter.module, drafter.draft_vocab)


@pytest.mark.parametrize("spec", [MedusaSpec(heads=2, topk=3), EagleSpec(feature_layers=(0, -1))])
def test_round_trip(tmp_path, tiny_llama, random_drafter, spec):
    model = tiny_llama(0)
    drafter = random_drafter(model, spec, vocab=torch.tensor([3, 5, 7]))
    path = _save(tmp_path, model, drafter)
    loaded = load_drafter(path, model, "tiny")
    assert loaded.spec == spec and loaded.kind == spec.kind
    assert loaded.draft_vocab.tolist() == [3, 5, 7]
    for (k, a), (_, b) in zip(
        drafter.module.state_dict().items(), loaded.module.state_dict().items()
    ):
        assert torch.equal(a, b), k
    assert not any(p.requires_grad for p in loaded.module.parameters())
    manifest = json.loads((path / "manifest.json").read_text())
    assert {
        "kind",
        "base_model_id",
        "base_weights_sha256",
        "adapter_sha256",
        "spec",
        "accept_rates",
        "heldout_tau",
        "training",
    } <= set(manifest)


def test_other_base_model_is_refused(tmp_path, tiny_llama, random_drafter):
    model, other = tiny_llama(0), tiny_llama(1)
    path = _save(tmp_path, model, random_drafter(model, MedusaSpec()))
    with pytest.raises(DrafterMismatchError, match="base model weights differ"):
        load_drafter(path, other, "other")


def test_other_adapter_or_missing_adapter_is_refused(tmp_path, tiny_llama, random_drafter):
    model = tiny_llama(0)
    path = _save(tmp_path, model, random_drafter(model, EagleSpec()), adapter="a" * 64)
    with pytest.raises(DrafterMismatchError, match="adapter differs.*served with " + "b" * 64):
        load_drafter(path, model, "tiny", adapter_sha256="b" * 64)
    with pytest.raises(DrafterMismatchError, match=r"served with none \(base model\)"):
        load_drafter(path, model, "tiny", adapter_sha256=None)
    assert load_drafter(path, model, "tiny", adapter_sha256="a" * 64).kind == "eagle"


def test_base_drafter_is_refused_for_an_adapter_variant(tmp_path, tiny_llama, random_drafter):
    model = tiny_llama(0)
    path = _save(tmp_path, model, random_drafter(model, MedusaSpec()))
    with pytest.raises(DrafterMismatchError, match=r"trained with adapter none \(base model\)"):
        load_drafter(path, model, "tiny", adapter_sha256="c" * 64)


def test_weights_hash_ignores_dtype_and_peft_wrapping_but_not_weights(tiny_llama):
    from peft import LoraConfig, get_peft_model

    model = tiny_llama(0)
    ref = base_weights_sha256(model)
    import copy

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    assert base_weights_sha256(bf16) == ref
    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    assert base_weights_sha256(wrapped) == ref
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.model.layers[0].mlp.up_proj.weight[0, 0] += 1.0
    assert base_weights_sha256(changed) != ref


def test_manifest_rejects_unknown_fields(tmp_path, tiny_llama, random_drafter):
    model = tiny_llama(0)
    path = _save(tmp_path, model, random_drafter(model, MedusaSpec()))
    raw = json.loads((path / "manifest.json").read_text())
    raw["colour"] = "blue"
    (path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="colour"):
        read_manifest(path)
    assert Manifest.model_fields["kind"]


def test_a_drafter_served_in_another_dtype_says_so(tmp_path, tiny_llama, random_drafter):
    import copy

    model = tiny_llama(0)
    drafter = random_drafter(model, EagleSpec())
    drafter.manifest.feature_dtype = "torch.float32"
    path = _save(tmp_path, model, drafter)
    assert load_drafter(path, model, "tiny").notes == []
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    notes = load_drafter(path, bf16, "tiny").notes
    assert (
        len(notes) == 1
        and "trained on torch.float32 features, served on torch.bfloat16" in notes[0]
    )


def test_older_manifests_fall_back_to_the_training_dtype(tmp_path, tiny_llama, random_drafter):
    model = tiny_llama(0)
    drafter = random_drafter(model, MedusaSpec())
    drafter.manifest.training = {"dtype": "torch.bfloat16"}
    path = _save(tmp_path, model, drafter)
    assert "served on torch.float32" in load_drafter(path, model, "tiny").notes[0]


def test_a_manifest_holds_a_spec_of_its_own_kind(tmp_path, tiny_llama, random_drafter):
    model = tiny_llama(0)
    path = _save(tmp_path, model, random_drafter(model, MedusaSpec()))
    raw = json.loads((path / "manifest.json").read_text())
    assert isinstance(read_manifest(path).spec, MedusaSpec)
    (path / "manifest.json").write_text(json.dumps({**raw, "kind": "eagle"}))
    with pytest.raises(ValueError, match="manifest of kind 'eagle' holds a 'medusa' spec"):
        read_manifest(path)
    unknown = {**raw, "kind": "lora", "spec": {**raw["spec"], "kind": "lora"}}
    (path / "manifest.json").write_text(json.dumps(unknown))
    with pytest.raises(ValueError, match="'eagle' or 'medusa'") as err:
        read_manifest(path)
    assert "'eagle', 'medusa'" in str(err.value)  # the spec's tag lists the kinds too
