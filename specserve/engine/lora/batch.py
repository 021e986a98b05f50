"""Per-row LoRA for a batch in two matmuls per layer (the Punica / S-LoRA idea), through hooks.

`lora_rows(model, names)` applies adapter names[b] to row b of the forwards run inside it. The
adapters are (A [r, in], B [out, r] with scaling folded in) per Linear, held by a `RowLoRA`: the
`LoRAStore` an adapter server attaches to a plain base model (lora/store.py), or one built from a
peft model's own layers (`PeftRows`, for peft-wrapped models). A mixed batch's adapters sit in
persistent slots (lora/slots.py: A_S [S r, in], B_S [out, S r] per module, one slot rewritten when
the composition changes by one adapter) and a hook adds `((x @ A_S^T) * select[row]) @ B_S^T`;
its cost follows the batch, not the resident count. Rows name their adapter (`BASE_ADAPTER`: no
adapter), so concurrent requests never race on peft's "active adapter".
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from dataclasses import dataclass, field

import torch

from specserve.engine import row_tiles
from specserve.engine.lora.slots import SlotGroup, selector

BASE_ADAPTER = "__base__"  # a row with no adapter (peft's name for it in a mixed batch)

Blocks = dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]  # module -> A [r, in], B [out, r]
_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its RowLoRA


def is_peft_model(model) -> bool:
    """True for a peft wrapper (it owns the injected LoRA layers and routes `adapter_names`)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def lora_rows(model, adapters: list[str | None], slotted: bool = False):
    """A context in which a forward of `model` applies adapters[b] to batch row b; one name
    applies to every row of any batch (a `generate()` call). None means the model's default
    when every row says None (no context: a plain model, a store model's base, a peft model's
    active adapter) and the base when mixed with names. Unknown names raise ValueError listing
    the resident ones. `slotted` (a compiled forward): every row through the slots, base rows
    included. Example: `with lora_rows(model, ["support@2", BASE_ADAPTER]): model(ids)` with
    ids [2, q]."""
    check_adapters(model, adapters)
    if all(a is None for a in adapters) and not slotted:
        return contextlib.nullcontext()
    rows = row_lora(model)
    if rows is None:  # a plain model asked for base rows only
        return contextlib.nullcontext()
    return rows.rows([BASE_ADAPTER if a is None else a for a in adapters], slotted=slotted)


def row_lora(model) -> RowLoRA | None:
    """The model's RowLoRA: its attached store, one built over its peft layers, or None."""
    rows = _ROWS.get(model)
    if rows is None and is_peft_model(model):
        rows = _ROWS[model] = PeftRows(model)
    return rows


def resident_adapters(model) -> list[str] | None:
    """Adapter names `model` can apply now, or None when it takes no adapters at all."""
    if is_peft_model(model):
        return sorted(model.peft_config)
    rows = _ROWS.get(model)
    return None if rows is None else rows.names


def takes_adapters(model) -> bool:
    """True when rows of `model` may name adapters (so base rows say `BASE_ADAPTER`)."""
    return is_peft_model(model) or model in _ROWS


def check_adapters(model, adapters: list[str | None]) -> None:
    """ValueError unless every named adapter is resident (BASE_ADAPTER and None always are);
    set lookups only, whatever the number resident."""
    named = {a for a in adapters if a not in (None, BASE_ADAPTER)}
    if not named:
        return
    if not takes_adapters(model):
        raise ValueError(f"adapter: {sorted(named)} requested but the model takes no adapters")
    held = model.peft_config if is_peft_model(model) else _ROWS[model]._adapters
    unknown = sorted(n for n in named if n not in held)
    if unknown:
        shown = resident_adapters(model)
        listed = shown[:20] + (["..."] if len(shown) > 20 else [])
        raise ValueError(f"adapter: {unknown} not resident; resident adapters: {listed}")


@dataclass
class _Forward:
    """What the forwards of one `rows` context apply."""

    present: tuple[str, ...]  # the batch's adapters, each once
    masked: bool  # rows differ in adapter (or some are base): each row keeps its own slot only
    groups: list = field(default_factory=list)  # (SlotGroup, [batch, 1, S r] selector) per rank


class RowLoRA:
    """Adapters as blocks per module plus the forward hooks that apply them per row.

    Subclasses fill `_adapters` (`_set` / `_drop`); `rows` is the context of one batch. A batch
    of one adapter applies that adapter's own blocks; a mixed batch places its adapters in the
    slot groups of their ranks (lora/slots.py) and each row keeps only its own slot's columns."""

    def __init__(self) -> None:
        self._adapters: dict[str, Blocks] = {}
        self._serial: dict[str, int] = {}  # changes when a name is (re)loaded
        self._rank: dict[str, int] = {}  # an adapter's largest rank: the slot group it joins
        self._counter = itertools.count(1)
        self._hooks: dict[torch.nn.Module, object] = {}  # module -> hook handle
        self._groups: dict[int, SlotGroup] = {}  # rank -> its slots
        self._forwards = 0  # rows contexts opened: the slots' clock
        self._mixed = threading.RLock()  # mixed batches share the slot buffers: one at a time
        self._local = threading.local()  # each thread's own `rows` context
        self._pinned: set[torch.nn.Module] = set()  # hooked whatever the adapters (`pin`)
        self._pinned_rank = 0  # adapters up to this rank share its slot group (`pin`)

    @property
    def _now(self) -> _Forward | None:
        return getattr(self._local, "now", None)

    @_now.setter
    def _now(self, value: _Forward | None) -> None:
        self._local.now = value

    @property
    def names(self) -> list[str]:
        return sorted(self._adapters)

    def __deepcopy__(self, memo) -> RowLoRA:
        """A copied model gets inert hooks: its copy holds no adapters (and is no store's)."""
        return RowLoRA()

    def _set(self, name: str, blocks: Blocks) -> None:
        self._adapters[name] = blocks
        self._serial[name] = next(self._counter)
        self._rank[name] = max(a.shape[0] for a, _ in blocks.values())
        for module, (a, _) in blocks.items():
            if module not in self._hooks:
                self._hooks[module] = module.register_forward_hook(self._hook)
                for group in self._groups.values():
                    group.add_module(module, a)

    def pin(self, modules: list[torch.nn.Module], rank: int, dtype: torch.dtype) -> None:
        """Keep hooks on `modules` whatever the adapters, with one slot group of `rank` that every
        adapter up to that rank joins (zero-padded): the hooks and the slot groups a slotted
        forward reads then stay the same as adapters come and go, so a compiled forward holds."""
        self._pinned_rank = rank
        group = self._groups.get(rank)
        if group is None:
            group = self._groups[rank] = SlotGroup(rank)
            like = torch.empty(0, dtype=dtype, device=modules[0].weight.device)
            for module in self._hooks:
                group.add_module(module, like)
        like = torch.empty(0, dtype=dtype, device=modules[0].weight.device)
        for module in modules:
            self._pinned.add(module)
            if module not in self._hooks:
                self._hooks[module] = module.register_forward_hook(self._hook)
                for g in self._groups.values():
                    g.add_module(module, like)

    def _drop(self, name: str) -> None:
        del self._adapters[name], self._serial[name], self._rank[name]
        for group in self._groups.values():
            group.release(name)
        used = {m for blocks in self._adapters.values() for m in blocks} | self._pinned
        for module in [m for m in self._hooks if m not in used]:
            self._hooks.pop(module).remove()
            for group in self._groups.values():
                group.drop_module(module)

    def _drop_all(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._adapters, self._serial, self._rank, self._hooks, self._groups = {}, {}, {}, {}, {}
        self._pinned, self._pinned_rank = set(), 0

    @contextlib.contextmanager
    def rows(self, names: list[str], slotted: bool = False):
        """Apply names[b] to row b (one name: every row) in the forwards inside; nests.
        `slotted`: through the slots even when every row has one adapter (what a compiled forward
        needs: the hook then reads tensors only)."""
        present = tuple(sorted({n for n in names if n != BASE_ADAPTER}))
        masked = len(present) > 1 or BASE_ADAPTER in names or slotted
        # base rows only, slotted and pinned: the pinned group with nothing selected
        place = masked and bool(present or (slotted and self._pinned_rank))
        with self._mixed if place else contextlib.nullcontext():
            now = _Forward(present, masked)
            if place:
                now.groups = self._place(names, present)
            outer, self._now = self._now, now
            try:
                yield
            finally:
                self._now = outer

    def _place(self, names: list[str], present: tuple[str, ...]) -> list:
        """Slot the batch's adapters by rank; (group, selector) per rank the batch holds."""
        self._forwards += 1
        by_rank: dict[int, dict] = {self._pinned_rank: {}} if self._pinned_rank else {}
        for name in present:
            key = (name, self._serial[name])
            rank = self._rank[name]
            rank = max(self._pinned_rank, rank)  # up to the pinned rank: the pinned group
            by_rank.setdefault(rank, {})[key] = self._adapters[name]
        out = []
        for rank, wanted in sorted(by_rank.items()):
            group = self._groups.get(rank)
            if group is None:
                group = self._groups[rank] = SlotGroup(rank)
                like = next(iter(next(iter(wanted.values())).values()))[0]
                for module in self._hooks:
                    group.add_module(module, like)
            slot_of = group.place(wanted, self._forwards)
            like = next(iter(group.buffers.values()))[0]
            rows = [slot_of.get(n, -1) for n in names]
            out.append((group, selector(rows, group.slots, rank, like)))
        return out

    @torch.inference_mode()
    def _hook(self, module, inputs, output):
        now = self._now
        if now is None:
            return None
        if now.groups:  # slotted: reads tensors only, so a compiled forward never retraces
            return output + _slot_delta(now.groups, module, inputs[0]).to(output.dtype)
        if not now.present:
            return None
        own = self._adapters[now.present[0]].get(module)  # one adapter on every row
        if own is None:
            return None
        a, b = own  # [r, in], [out, r]
        plan = row_tiles.row_plan(module)
        low = row_tiles.linear(inputs[0].to(a.dtype), a, plan=plan)  # [batch, q, r]
        return output + row_tiles.linear(low, b, plan=plan).to(output.dtype)


def _slot_delta(groups: list, module, x: torch.Tensor) -> torch.Tensor:
    """[batch, q, out]: each row's own slot of every rank group, `((x @ A_S^T) * select) @ B_S^T`."""
    delta = None
    plan = row_tiles.row_plan(module)
    for group, select in groups:
        a, b = group.buffers[module]  # [S r, in], [out, S r]
        low = row_tiles.linear(x.to(a.dtype), a, plan=plan)  # [batch, q, S r]
        part = row_tiles.linear(low * select, b, plan=plan)  # only each row's own slot
        delta = part if delta is None else delta + part
    return delta


class PeftRows(RowLoRA):
    """RowLoRA over a peft model's own LoRA layers (copies B x scaling; restacks when adapters
    are added, removed or reloaded). peft's LoRA is off inside `rows`: the hooks add it. The
    only peft internals read (`lora_A`, `lora_B`, `scaling`, `lora_variant`, `_disable_adapters`)
    are read here, pinned by tests/engine/lora/test_batch.py."""

    def __init__(self, model) -> None:
        super().__init__()
        self._model = weakref.ref(model)  # kept by the model, never keeps it
        self._key: tuple | None = None

    @contextlib.contextmanager
    def rows(self, names: list[str], slotted: bool = False):
        self._sync()
        layers = list(self._hooks)
        before = [m._disable_adapters for m in layers]
        for m in layers:  # peft's own LoRA off (peft's disable_adapter context is slow)
            m._disable_adapters = True
        try:
            with super().rows(names, slotted):
                yield
        finally:
            for m, flag in zip(layers, before, strict=True):
                m._disable_adapters = flag

    @property
    def model(self):
        return self._model()

    def _layers(self):
        return [m for m in self.model.modules() if hasattr(m, "lora_A") and hasattr(m, "scaling")]

    def _key_of(self, layers) -> tuple:
        """Resident names, and where one layer's weights live (a reload moves them)."""
        names = tuple(sorted(self.model.peft_config))
        first = layers[0]
        return names, tuple(first.lora_A[n].weight.data_ptr() for n in names if n in first.lora_A)

    def _sync(self) -> None:
        if self._hooks and self._key_of(list(self._hooks)) == self._key:
            return  # nothing added, removed or reloaded (checked on one layer, not a module walk)
        layers = self._layers()
        if not layers:
            raise ValueError("peft model without LoRA layers")
        key = self._key_of(layers)
        if any(not hasattr(m, "_disable_adapters") for m in layers):
            raise RuntimeError("peft LoRA layers lack `_disable_adapters`")
        self._drop_all()
        for name in sorted(self.model.peft_config):
            blocks = {m: _peft_blocks(m, name) for m in layers if name in m.lora_A}
            self._set(name, blocks)
        self._key = key


def _peft_blocks(module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One peft LoRA layer's (A [r, in], B x scaling [out, r]) for adapter `name`."""
    if name in getattr(module, "lora_variant", {}) or module.lora_B[name].bias is not None:
        raise ValueError(f"adapter {name}: only plain LoRA (no DoRA, no bias) batches here")
    a = module.lora_A[name].weight.detach()
    b = module.lora_B[name].weight.detach() * module.scaling[name]
    return a, b


__all__ = [
    "BASE_ADAPTER",
    "PeftRows",
    "RowLoRA",
    "check_adapters",
    "lora_rows",
    "resident_adapters",
    "row_lora",
    "takes_adapters",
]
