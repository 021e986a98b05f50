"""Adapter files to store tensors: peft's scaling rules (alpha / r, rsLoRA, rank and alpha
patterns), 16-bit files upcast as peft does, and configs beyond plain LoRA refused."""

from __future__ import annotations

import copy
import json
import math

import peft
import pytest
import torch

from specserve.adapters import errors
from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.tensors import pattern_value, scaling_of, store_dtype
from specserve.engine.lora.batch import lora_rows

BASE = "tiny-llama"


def _save(root, name, base, config: peft.LoraConfig, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.3)
    wrapped.to(dtype)
    out = root / name
    wrapped.save_pretrained(out)
    cfg = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps(cfg | {"base_model_name_or_path": BASE}))
    return out


def _logits(model, ids, name):
    with torch.no_grad(), lora_rows(model, [name]):
        return model(input_ids=ids).logits


CONFIGS = {
    "plain": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "rslora": {
        "r": 4,
        "lora_alpha": 8,
        "use_rslora": True,
        "target_modules": ["q_proj", "down_proj"],
    },
    "patterns": {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj", "o_proj"],
        "rank_pattern": {"v_proj": 2, "layers.1.self_attn.q_proj": 8},
        "alpha_pattern": {"o_proj": 3},
    },
}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_loaded_adapter_equals_peft_from_pretrained(kind, tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    path = _save(adapter_root, kind, base, peft.LoraConfig(**CONFIGS[kind]))
    resident = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    resident.ensure("v@1", path)
    reference = peft.PeftModel.from_pretrained(copy.deepcopy(base), path, adapter_name="v@1")
    reference.eval()
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(1))
    ours = _logits(base, ids, "v@1")
    assert torch.equal(ours, _logits(reference, ids, "v@1"))  # same blocks as peft's layers
    with torch.no_grad():
        torch.testing.assert_close(ours, reference(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_bf16_file_upcast_like_peft(tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    path = _save(adapter_root, "half", base, peft.LoraConfig(**CONFIGS["plain"]), torch.bfloat16)
    resident = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    resident.ensure("h@1", path)
    blocks = next(iter(resident.store._adapters["h@1"].values()))
    assert blocks[0].dtype == torch.float32
    reference = peft.PeftModel.from_pretrained(copy.deepcopy(base), path, adapter_name="h@1")
    ids = torch.randint(0, 96, (1, 8))
    assert torch.equal(_logits(base, ids, "h@1"), _logits(reference.eval(), ids, "h@1"))


def test_scaling_rules_worked_examples():
    assert scaling_of({"r": 8, "lora_alpha": 16}, "m.q_proj") == 2.0
    assert scaling_of({"r": 16, "lora_alpha": 8, "use_rslora": True}, "m.q_proj") == 8 / 4
    patterns = {"r": 4, "lora_alpha": 8, "rank_pattern": {"v_proj": 2}, "alpha_pattern": {}}
    assert scaling_of(patterns, "model.layers.0.self_attn.v_proj") == 4.0
    assert scaling_of(patterns, "model.layers.0.self_attn.q_proj") == 2.0
    assert scaling_of({}, "x") == 1.0  # peft's defaults: r 8, alpha 8
    assert pattern_value({"layers.1.q": 8}, "model.layers.1.q", 4) == 8
    assert pattern_value({"layers.1.q": 8}, "model.xlayers.1.q", 4) == 4  # a whole '.'-part
    assert math.isclose(scaling_of({"r": 2, "lora_alpha": 1, "use_rslora": True}, "x"), 2**-0.5)
    assert (
        store_dtype(torch.bfloat16) == torch.float32 and store_dtype(torch.float64) == torch.float64
    )


@pytest.mark.parametrize(
    "key, value", [("lora_bias", True), ("fan_in_fan_out", True), ("target_parameters", ["w"])]
)
def test_configs_beyond_plain_lora_are_refused(key, value, tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    path = _save(adapter_root, key, base, peft.LoraConfig(**CONFIGS["plain"]))
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps(cfg | {key: value}))
    resident = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    with pytest.raises(errors.UnsupportedAdapterError, match=key):
        resident.ensure("u@1", path)
    assert resident.names == [] and resident.stats.refusals == {"adapter_unsupported": 1}


def test_tensor_rank_must_match_the_config(tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    path = _save(adapter_root, "lies", base, peft.LoraConfig(**CONFIGS["plain"]))
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps(cfg | {"r": 2}))
    resident = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    with pytest.raises(errors.CorruptAdapterError, match="rank 4, config says 2"):
        resident.ensure("l@1", path)
