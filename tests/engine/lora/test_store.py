"""The LoRAStore: adapters as plain tensors beside a base model, applied per row by `lora_rows`,
bitwise equal to the same adapters applied from peft's layers, close to peft's own path and to
merged weights; adds and removes touch nothing else; copies and other threads stay unaffected."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from peft import LoraConfig, get_peft_model
from schedules import peft_tensors

from specserve.engine.lora.batch import BASE_ADAPTER, lora_rows, resident_adapters, takes_adapters
from specserve.engine.lora.store import attach_store, store_of

TARGETS = {"x1": ["q_proj", "v_proj"], "x2": ["down_proj", "q_proj"], "x3": ["o_proj"]}
RANKS = {"x1": 4, "x2": 2, "x3": 8}


@pytest.fixture
def pair(tiny_llama):
    """(plain base with a store, peft model) holding the same three random adapters."""
    base = tiny_llama(1, init_range=0.1)
    peft_model = None
    for name, targets in TARGETS.items():
        config = LoraConfig(r=RANKS[name], lora_alpha=2 * RANKS[name], target_modules=targets)
        if peft_model is None:
            peft_model = get_peft_model(copy.deepcopy(base), config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
    torch.manual_seed(4)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.2)
    peft_model.requires_grad_(False).eval()
    plain = copy.deepcopy(base).eval()
    store = attach_store(plain)
    for name in TARGETS:
        store.add(name, peft_tensors(peft_model, name))
    return plain, peft_model


def _logits(model, ids, names):
    with torch.no_grad(), lora_rows(model, names):
        return model(input_ids=ids).logits


NAMES = [["x1", BASE_ADAPTER, "x2", "x3"], ["x3", "x3", "x3", "x3"], ["x2", "x1", "x1", "x2"]]


@pytest.mark.parametrize("names", NAMES)
def test_store_rows_equal_peft_layers_bitwise_and_peft_path_closely(pair, names):
    plain, peft_model = pair
    ids = torch.randint(0, 96, (4, 7), generator=torch.Generator().manual_seed(2))
    ours = _logits(plain, ids, names)
    assert torch.equal(ours, _logits(peft_model, ids, names))  # same blocks, same hooks
    with torch.no_grad():
        peft_own = peft_model(input_ids=ids, adapter_names=names).logits
    torch.testing.assert_close(ours, peft_own, rtol=1e-5, atol=1e-5)
    for row, name in enumerate(names):
        alone = _logits(plain, ids[row : row + 1], [name])
        # alone is the one-adapter path (its own blocks), the batch the slot path: same sums
        # up to float rounding (the gates check tokens)
        torch.testing.assert_close(ours[row : row + 1], alone, rtol=1e-5, atol=1e-5)


def test_store_equals_merged_weights(pair):
    plain, peft_model = pair
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(3))
    for name in TARGETS:
        merged = copy.deepcopy(peft_model)
        merged.set_adapter(name)
        merged = merged.merge_and_unload()
        with torch.no_grad():
            want = merged(input_ids=ids).logits
        torch.testing.assert_close(_logits(plain, ids, [name]), want, rtol=1e-5, atol=1e-5)


def test_base_rows_and_no_context_are_bitwise_the_base(pair, tiny_llama):
    plain, _ = pair
    reference = tiny_llama(1, init_range=0.1)
    ids = torch.randint(0, 96, (3, 5))
    with torch.no_grad():
        want = reference(input_ids=ids).logits
        assert torch.equal(plain(input_ids=ids).logits, want)
    assert torch.equal(_logits(plain, ids, [BASE_ADAPTER] * 3), want)
    assert torch.equal(_logits(plain, ids, [None]), want)


def test_add_and_remove_touch_only_their_own_adapter(pair):
    plain, _ = pair
    store = store_of(plain)
    ids = torch.randint(0, 96, (1, 6))
    before = {n: _logits(plain, ids, [n]) for n in TARGETS}
    hooked = len(store._hooks)
    a, b = store._adapters["x3"][next(iter(store._adapters["x3"]))]
    extra = {"model.layers.0.mlp.up_proj": (torch.randn(4, 64) * 0.2, torch.randn(128, 4) * 0.2)}
    store.add("y", extra)
    assert store.bytes_of("y") == (4 * 64 + 128 * 4) * 4
    assert len(store._hooks) == hooked + 1
    assert resident_adapters(plain) == ["x1", "x2", "x3", "y"] and takes_adapters(plain)
    for n, logits in before.items():
        assert torch.equal(_logits(plain, ids, [n]), logits)
    assert not torch.allclose(_logits(plain, ids, ["y"]), _logits(plain, ids, [BASE_ADAPTER]))
    store.remove("y")
    assert len(store._hooks) == hooked  # a module nobody targets loses its hook
    with pytest.raises(ValueError, match="not resident"):
        _logits(plain, ids, ["y"])
    store.add("x3", {"model.layers.1.self_attn.o_proj": (a * 0, b)})  # reload: new weights
    assert torch.equal(_logits(plain, ids, ["x3"]), _logits(plain, ids, [BASE_ADAPTER]))
    assert torch.equal(_logits(plain, ids, ["x1"]), before["x1"])


def test_adds_are_checked_against_the_base(pair):
    plain, _ = pair
    store = store_of(plain)
    with pytest.raises(ValueError, match="no module"):
        store.add(
            "z", {"model.layers.9.self_attn.q_proj": (torch.zeros(2, 64), torch.zeros(64, 2))}
        )
    with pytest.raises(TypeError, match="not a Linear"):
        store.add("z", {"model.norm": (torch.zeros(2, 64), torch.zeros(64, 2))})
    with pytest.raises(ValueError, match="do not fit"):
        store.add("z", {"model.layers.0.mlp.up_proj": (torch.zeros(2, 64), torch.zeros(64, 2))})
    with pytest.raises(ValueError, match="reserved"):
        store.add(BASE_ADAPTER, {})
    with pytest.raises(ValueError, match="attach to the base"):
        attach_store(get_peft_model(copy.deepcopy(plain), LoraConfig(target_modules=["q_proj"])))
    assert "z" not in store.names


def test_a_copy_of_the_model_holds_no_adapters(pair):
    plain, _ = pair
    copied = copy.deepcopy(plain)
    ids = torch.randint(0, 96, (1, 6))
    assert not takes_adapters(copied)
    with pytest.raises(ValueError, match="takes no adapters"):
        _logits(copied, ids, ["x1"])
    with torch.no_grad():
        assert torch.equal(copied(input_ids=ids).logits, _logits(plain, ids, [BASE_ADAPTER]))


def test_each_thread_sees_its_own_rows(pair):
    """A forward on another thread, outside any context, is the base while this thread's
    context applies an adapter (the engine thread and, say, a warm-up never mix)."""
    plain, _ = pair
    ids = torch.randint(0, 96, (1, 6))
    base = _logits(plain, ids, [BASE_ADAPTER])
    seen = {}
    with torch.no_grad(), lora_rows(plain, ["x1"]):
        worker = threading.Thread(target=lambda: seen.update(out=plain(input_ids=ids).logits))
        worker.start()
        worker.join()
        mine = plain(input_ids=ids).logits
    assert torch.equal(seen["out"], base) and not torch.allclose(mine, base, atol=1e-3)
