"""Slot buffers: after any sequence of batch compositions every wanted adapter's slot holds exactly
its blocks (zero-padded, zeros on modules it lacks), only newcomers are written, the least
recently used slot is reused first, and growth keeps every slot; against a slow reference."""

from __future__ import annotations

import random

import torch

from specserve.engine.lora.slots import SlotGroup, selector

RANK = 4


def _modules():
    return [torch.nn.Linear(6, 5, bias=False), torch.nn.Linear(6, 3, bias=False)]


def _adapter(modules, seed: int) -> dict:
    """Blocks on a random subset of the modules, ranks up to RANK."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    picked = [m for m in modules if rng.random() < 0.7] or modules[:1]
    out = {}
    for m in picked:
        r = rng.randint(1, RANK)
        out[m] = (torch.randn(r, 6, generator=gen), torch.randn(m.out_features, r, generator=gen))
    return out


def _reference_slot(modules, blocks, module) -> tuple[torch.Tensor, torch.Tensor]:
    """What a slot must hold for `module`: the blocks padded to RANK, or zeros."""
    a = torch.zeros(RANK, 6)
    b = torch.zeros(module.out_features, RANK)
    if module in blocks:
        own_a, own_b = blocks[module]
        a[: own_a.shape[0]], b[:, : own_a.shape[0]] = own_a, own_b
    return a, b


def test_random_compositions_hold_exactly_their_adapters():
    modules = _modules()
    adapters = {f"a{i}": _adapter(modules, i) for i in range(10)}
    group = SlotGroup(RANK, slots=2)
    for m in modules:
        group.add_module(m, torch.zeros(1))
    rng = random.Random(0)
    for clock in range(1, 60):
        names = rng.sample(sorted(adapters), rng.randint(1, 5))
        wanted = {(n, 1): adapters[n] for n in names}
        before = list(group.holder)
        writes = group.writes
        slot_of = group.place(wanted, clock)
        assert sorted(slot_of) == sorted(names) and len(set(slot_of.values())) == len(names)
        new = [n for n in names if (n, 1) not in before]
        assert group.writes - writes == len(new)  # only newcomers are written
        for name, s in slot_of.items():
            for m in modules:
                want_a, want_b = _reference_slot(modules, adapters[name], m)
                a, b = group.buffers[m]
                assert torch.equal(a[s * RANK : (s + 1) * RANK], want_a)
                assert torch.equal(b[:, s * RANK : (s + 1) * RANK], want_b)
    assert group.slots == 8  # grew (doubling) to hold five at once, kept it


def test_least_recently_used_slot_is_reused_first():
    modules = _modules()
    adapters = {n: _adapter(modules, i) for i, n in enumerate("abcd")}
    group = SlotGroup(RANK, slots=3)
    for m in modules:
        group.add_module(m, torch.zeros(1))
    group.place({("a", 1): adapters["a"]}, 1)
    group.place({("b", 1): adapters["b"]}, 2)
    group.place({("c", 1): adapters["c"]}, 3)
    group.place({("a", 1): adapters["a"]}, 4)  # a used again: b is now the oldest
    slot = group.place({("d", 1): adapters["d"]}, 5)["d"]
    assert group.holder[slot] == ("d", 1) and ("b", 1) not in group.holder
    group.release("c")
    assert ("c", 1) not in group.holder  # an unloaded adapter's slot is free for the next one


def test_selector_worked_example():
    got = selector([1, -1, 0], 2, 1, torch.zeros(1))
    assert got.tolist() == [[[0, 1]], [[0, 0]], [[1, 0]]]
