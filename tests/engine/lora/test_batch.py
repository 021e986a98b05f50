"""Pins the batched-LoRA path (the peft internals it reads) against peft's own mixed-batch
forward and against merged weights: adapters of different ranks and target modules, base rows,
restacking after a load, an unload and a reload under the same name."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from specserve.engine.lora.batch import BASE_ADAPTER, lora_rows


def _randomize(model, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.2)


@pytest.fixture
def model(tiny_llama):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    m = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), adapter_name="x1"
    )
    m.add_adapter("x2", LoraConfig(r=2, lora_alpha=2, target_modules=["down_proj", "q_proj"]))
    _randomize(m, 3)
    for p in m.parameters():
        p.requires_grad_(False)
    return m.eval()


def _logits(model, ids, names):
    with lora_rows(model, names):
        return model(input_ids=ids).logits


def test_rows_equal_peft_mixed_batch_and_merged_weights(model):
    ids = torch.randint(0, 96, (4, 7))
    names = ["x1", BASE_ADAPTER, "x2", "x1"]
    ours = _logits(model, ids, names)
    peft_rows = model(input_ids=ids, adapter_names=names).logits
    torch.testing.assert_close(ours, peft_rows, rtol=1e-5, atol=1e-5)
    for row, name in enumerate(names):
        alone = model(input_ids=ids[row : row + 1], adapter_names=[name]).logits
        torch.testing.assert_close(ours[row : row + 1], alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # the adapter matters
    # peft's own path is restored after the context
    assert all(not m._disable_adapters for m in model.modules() if hasattr(m, "lora_A"))


def test_selector_keeps_each_rows_own_slot():
    from specserve.engine.lora.slots import selector

    select = selector([1, -1, 0], 2, 2, torch.zeros(1))
    assert select[:, 0].tolist() == [[0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]]


def test_mixed_ranks_take_one_slot_group_each(model):
    from specserve.engine.lora.batch import row_lora

    ids = torch.randint(0, 96, (3, 2))
    rows = row_lora(model)
    with lora_rows(model, ["x2", BASE_ADAPTER, "x1"]):
        groups = rows._now.groups
        model(input_ids=ids)
    assert [g.rank for g, _ in groups] == [2, 4]  # x2 rank 2, x1 rank 4
    for group, select in groups:
        own = 2 if group.rank == 4 else 0  # the row holding this group's adapter
        assert select[own, 0].sum() == group.rank and select[1].sum() == 0
    v_proj = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn.v_proj"))
    rank2 = next(g for g, _ in groups if g.rank == 2)
    assert not rank2.buffers[v_proj][0].any()  # x2 does not touch v_proj: its slot is zeros


def test_a_forward_computes_only_the_adapters_its_batch_holds(tiny_llama):
    """Twelve resident, a few in each batch: the slot buffers are as wide as the most adapters
    one batch held, a composition change rewrites only the newcomer's slot, a one-adapter
    prefill uses its own blocks, and the rows still equal peft's own mixed batch."""
    from specserve.engine.lora.batch import row_lora

    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    m = get_peft_model(base, config, adapter_name="a0")
    for i in range(1, 12):
        m.add_adapter(f"a{i}", config)
    _randomize(m, 5)
    m.requires_grad_(False)
    m.eval()
    ids = torch.randint(0, 96, (3, 5), generator=torch.Generator().manual_seed(1))
    rows = row_lora(m)
    for names in (["a7", "a3", "a7"], ["a7", "a5", "a3"], ["a9", "a5", "a3"]):
        ours = _logits(m, ids, names)
        torch.testing.assert_close(ours, m(input_ids=ids, adapter_names=names).logits)
    group = rows._groups[4]
    layer = next(iter(rows._hooks))
    assert group.slots == 4 and group.buffers[layer][0].shape == (4 * 4, 64)  # not 12 x 4
    assert group.writes == 4  # a7, a3; then a5; then a9: each adapter written once
    _logits(m, ids[:1], ["a7"])  # a prefill of one request: its own blocks, no slots
    assert group.writes == 4
    for _ in range(2):
        for names in (["a1", "a2", "a4", "a6", "a8"], ["a1", "a2", "a4", "a6", "a8"]):
            torch.testing.assert_close(
                _logits(m, ids.repeat(2, 1)[:5], names),
                m(input_ids=ids.repeat(2, 1)[:5], adapter_names=names).logits,
            )
    assert group.slots == 8 and group.writes == 9  # grown for five at once, written once each


def test_a_rows_result_does_not_depend_on_its_neighbours(model):
    """The same row next to other adapters (or alone) gives the same logits; a batch of base
    rows adds nothing at all (bitwise the base model)."""
    ids = torch.randint(0, 96, (1, 6))
    alone = _logits(model, ids, ["x1"])
    for others in (["x2", "x2"], [BASE_ADAPTER, "x1"]):
        batch = _logits(model, torch.cat([ids, torch.randint(0, 96, (2, 6))]), ["x1", *others])
        torch.testing.assert_close(batch[:1], alone, rtol=1e-6, atol=1e-6)
    with model.disable_adapter():
        base = model(input_ids=ids).logits
    assert torch.equal(_logits(model, ids, [BASE_ADAPTER]), base)


def test_restacks_after_load_unload_and_reload(model):
    ids = torch.randint(0, 96, (1, 5))
    before = _logits(model, ids, ["x2"])
    model.delete_adapter("x2")
    with pytest.raises(ValueError, match="not resident"):
        _logits(model, ids, ["x2"])
    model.add_adapter("x2", LoraConfig(r=2, lora_alpha=2, target_modules=["down_proj"]))
    _randomize(model, 11)  # new weights under the old name
    after = _logits(model, ids, ["x2"])
    assert not torch.allclose(before, after, atol=1e-4)
    torch.testing.assert_close(
        after, model(input_ids=ids, adapter_names=["x2"]).logits, rtol=1e-5, atol=1e-5
    )


def test_plain_model_and_default_rows_take_no_hooks(tiny_llama):
    plain = tiny_llama(1, init_range=0.1)
    ids = torch.randint(0, 96, (2, 3))
    with lora_rows(plain, [None, None]):
        out = plain(input_ids=ids).logits
    torch.testing.assert_close(out, plain(input_ids=ids).logits)


FAMILY_TARGETS = {  # two adapters per family, on its own (fused where it has them) projections
    "llama": (["q_proj", "v_proj"], ["down_proj", "q_proj"]),
    "qwen2": (["q_proj", "v_proj"], ["down_proj", "k_proj"]),
    "qwen3": (["q_proj", "o_proj"], ["down_proj", "up_proj"]),
    "mistral": (["q_proj", "v_proj"], ["gate_proj", "o_proj"]),
    "gemma2": (["q_proj", "v_proj"], ["down_proj", "o_proj"]),
    "gemma3": (["k_proj", "v_proj"], ["down_proj", "q_proj"]),
    "phi3": (["qkv_proj"], ["gate_up_proj", "o_proj"]),
    "olmo2": (["q_proj", "v_proj"], ["down_proj"]),
    "gpt_neox": (["query_key_value"], ["dense_4h_to_h", "dense"]),
}


@pytest.mark.parametrize("family", list(FAMILY_TARGETS))
def test_rows_equal_peft_mixed_batch_on_each_family(family):
    from conftest import make_tiny_family

    first, second = FAMILY_TARGETS[family]
    base = copy.deepcopy(make_tiny_family(family, seed=1))
    m = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=first), "x1")
    m.add_adapter("x2", LoraConfig(r=2, lora_alpha=2, target_modules=second))
    _randomize(m, 3)
    m.requires_grad_(False)
    m.eval()
    ids = torch.randint(0, 96, (4, 7), generator=torch.Generator().manual_seed(0))
    names = ["x1", BASE_ADAPTER, "x2", "x1"]
    ours = _logits(m, ids, names)
    torch.testing.assert_close(ours, m(input_ids=ids, adapter_names=names).logits)
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # the adapter matters
    assert not torch.allclose(ours[1], ours[2], atol=1e-3)
