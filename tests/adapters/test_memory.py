"""The resident budget (a share of free memory, or fixed) and the reference adapter it counts in."""

from __future__ import annotations

import copy

import psutil
import pytest
import torch
import transformers

from specserve.adapters.memory import budget_bytes, free_bytes, reference_adapter_bytes
from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec


def _smollm2_sized():
    """A SmolLM2-135M-shaped Llama on the meta device (shapes only, no memory)."""
    config = transformers.LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
    )
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def test_reference_adapter_is_rank_8_on_the_family_defaults():
    model = _smollm2_sized()
    spec = BaseModelSpec.of(model, ["x"])
    # q, o: 8 x (576 + 576); k, v: 8 x (192 + 576); 30 layers; float32
    assert reference_adapter_bytes(spec, model, torch.float32) == 3_686_400
    assert reference_adapter_bytes(spec, model, torch.bfloat16) == 3_686_400 // 2


def test_budget_is_a_share_of_free_memory_unless_fixed(tmp_path):
    limits = AdapterLimits(root=tmp_path)
    budget = budget_bytes(limits, torch.device("cpu"))
    assert 0 < budget <= 0.2 * psutil.virtual_memory().total
    assert abs(budget - 0.2 * free_bytes(torch.device("cpu"))) < 0.05 * budget  # free moves
    fixed = AdapterLimits(root=tmp_path, max_resident_bytes=12345)
    assert budget_bytes(fixed, torch.device("cpu")) == 12345
    with pytest.raises(ValueError):
        AdapterLimits(root=tmp_path, resident_memory_fraction=1.5)


def test_capacity_counts_reference_adapters_within_the_count_cap(tiny_llama, tmp_path):
    model = copy.deepcopy(tiny_llama(1, init_range=0.1))  # a store attaches to it
    spec = BaseModelSpec.of(model, ["tiny-llama"])
    per = reference_adapter_bytes(spec, model, torch.float32)
    limits = AdapterLimits(root=tmp_path, max_resident_bytes=130 * per + per // 2)
    assert ResidentAdapters(model, ["tiny-llama"], limits).capacity == 130
    capped = limits.model_copy(update={"max_resident": 9})
    assert ResidentAdapters(model, ["tiny-llama"], capped).capacity == 9
