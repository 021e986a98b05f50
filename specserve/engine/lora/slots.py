"""Slot buffers for mixed-adapter batches: the adapters of one rank that recent batches held, side by
side in one persistent (A [S r, in], B [out, S r]) pair per module, so a batch composition that
changes by one adapter rewrites one slot (r rows of A, r columns of B per module), not the blocks
of every adapter in the batch. A forward's LoRA cost follows S, the most adapters of that rank
one batch held, never the number resident.
"""

from __future__ import annotations

import torch

Blocks = dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]  # module -> A [r, in], B [out, r]


class SlotGroup:
    """The slots of one rank r: slot s holds an adapter's blocks in rows s r .. s r + r - 1 of
    every module's A buffer (zeros on modules it does not touch; a smaller rank zero-padded) and
    the same columns of B."""

    def __init__(self, rank: int, slots: int = 4) -> None:
        self.rank = rank
        self.holder: list[tuple[str, int] | None] = [None] * slots  # slot -> (name, serial)
        self.used: list[int] = [0] * slots  # forward counter of a slot's last use
        self.buffers: Blocks = {}  # module -> (A [S r, in], B [out, S r])
        self.writes = 0  # slots (re)written, for tests and figures

    @property
    def slots(self) -> int:
        return len(self.holder)

    def place(self, wanted: dict[tuple[str, int], Blocks], clock: int) -> dict[str, int]:
        """Slots of the `wanted` adapters ((name, serial) -> blocks), writing only those not
        slotted already (into free or least-recently-used slots, growing when all are wanted).
        Returns name -> slot."""
        slot_of = {key: s for s, key in enumerate(self.holder) if key in wanted}
        missing = [key for key in wanted if key not in slot_of]
        if len(wanted) > self.slots:
            self._grow(len(wanted))
        spare = sorted(
            (s for s, key in enumerate(self.holder) if key not in wanted),
            key=lambda s: (self.holder[s] is not None, self.used[s]),
        )
        for key, s in zip(missing, spare, strict=False):
            self._write(s, wanted[key])
            self.holder[s] = key
            slot_of[key] = s
        for s in slot_of.values():
            self.used[s] = clock
        return {name: s for (name, _), s in slot_of.items()}

    def release(self, name: str) -> None:
        """Forget `name`'s slot (an unloaded adapter); its slot is rewritten before reuse."""
        self.holder = [None if key and key[0] == name else key for key in self.holder]

    def add_module(self, module: torch.nn.Module, like: torch.Tensor) -> None:
        """Zero buffers for a module newly touched by some adapter (no slot holds it yet)."""
        s, r = self.slots, self.rank
        with torch.inference_mode():  # as `_grow` makes them (a compiled forward guards this)
            a = torch.zeros(s * r, module.in_features, dtype=like.dtype, device=like.device)
            b = torch.zeros(module.out_features, s * r, dtype=like.dtype, device=like.device)
        self.buffers[module] = _fixed_features(a, b)

    def drop_module(self, module: torch.nn.Module) -> None:
        self.buffers.pop(module, None)

    @torch.inference_mode()  # the buffers are inference tensors (`_fixed_features`)
    def _write(self, slot: int, blocks: Blocks) -> None:
        r, lo = self.rank, slot * self.rank
        for module, (a_buf, b_buf) in self.buffers.items():
            a_buf[lo : lo + r].zero_()
            b_buf[:, lo : lo + r].zero_()
            own = blocks.get(module)
            if own is not None:
                a, b = own  # [r_m, in], [out, r_m], r_m <= r
                a_buf[lo : lo + a.shape[0]].copy_(a)
                b_buf[:, lo : lo + a.shape[0]].copy_(b)
        self.writes += 1

    @torch.inference_mode()
    def _grow(self, need: int) -> None:
        """At least `need` slots (doubling), keeping every slot's contents."""
        slots = self.slots
        while slots < need:
            slots *= 2
        extra = (slots - self.slots) * self.rank
        for module, (a, b) in self.buffers.items():
            a_new = torch.cat([a, a.new_zeros(extra, a.shape[1])])
            b_new = torch.cat([b, b.new_zeros(b.shape[0], extra)], dim=1)
            self.buffers[module] = _fixed_features(a_new, b_new)
        self.holder += [None] * (slots - self.slots)
        self.used += [0] * (slots - len(self.used))


def _fixed_features(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Marks a module's in and out sizes static (only S r varies) for a compiled forward. Every
    buffer is an inference tensor (made or grown in inference mode): the graph guards dispatch
    keys, and a buffer grown inside a forward differed from one made outside (measured)."""
    torch._dynamo.mark_static(a, 1)
    torch._dynamo.mark_static(b, 0)
    return a, b


def selector(slot_of_row: list[int], slots: int, rank: int, like: torch.Tensor) -> torch.Tensor:
    """[batch, 1, slots x rank]: 1 on the rank columns of each row's slot (-1: no slot here).
    Example: slot_of_row [1, -1, 0], 2 slots, rank 1 -> [[[0, 1]], [[0, 0]], [[1, 0]]]."""
    index = torch.tensor(slot_of_row) + 1  # [batch], 0 = none
    onehot = torch.nn.functional.one_hot(index, slots + 1)[:, 1:]  # [batch, slots]
    select = onehot.repeat_interleave(rank, dim=1)[:, None].to(like)
    torch._dynamo.mark_static(
        select, 1
    )  # a literal 1 (broadcast over q), even in a compiled forward
    return select
