"""Per-row LoRA for a batch in two matmuls per layer (the Punica / S-LoRA idea), through hooks.

`lora_rows(model, names)` applies adapter names[b] to row b of the forwards run inside it. The
adapters are (A [r, in], B [out, r] with scaling folded in) per Linear, held by a `RowLoRA`: the
`LoRAStore` an adapter server attaches to a plain base model (lora_store.py), or one built from a
peft model's own layers (`PeftRows`, for peft-wrapped models). A forward picks the blocks of the k
adapters its batch holds (A_k [k r, in], B_k [out, k r], cached per batch composition) and a hook
adds `((x @ A_k^T) * select[row]) @ B_k^T`; its cost follows the batch, not the resident count.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from specserve.engine.lora import BASE_ADAPTER, is_peft_model

Blocks = dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]  # module -> A [r, in], B [out, r]
_ROWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its RowLoRA


def lora_rows(model, adapters: list[str | None]):
    """A context in which a forward of `model` applies adapters[b] to batch row b; one name
    applies to every row of any batch (a `generate()` call). None means the model's default
    when every row says None (no context: a plain model, a store model's base, a peft model's
    active adapter) and the base when mixed with names. Unknown names raise ValueError listing
    the resident ones. Example: `with lora_rows(model, ["support@2", BASE_ADAPTER]): model(ids)`
    with ids [2, q]."""
    check_adapters(model, adapters)
    if all(a is None for a in adapters):
        return contextlib.nullcontext()
    rows = row_lora(model)
    if rows is None:  # a plain model asked for base rows only
        return contextlib.nullcontext()
    return rows.rows([BASE_ADAPTER if a is None else a for a in adapters])


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
    return resident_adapters(model) is not None


def check_adapters(model, adapters: list[str | None]) -> None:
    """ValueError unless every named adapter is resident (BASE_ADAPTER and None always are)."""
    named = {a for a in adapters if a not in (None, BASE_ADAPTER)}
    if not named:
        return
    resident = resident_adapters(model)
    if resident is None:
        raise ValueError(f"adapter: {sorted(named)} requested but the model takes no adapters")
    unknown = sorted(named - set(resident))
    if unknown:
        raise ValueError(f"adapter: {unknown} not resident; resident adapters: {resident}")


@dataclass
class _Forward:
    """What the forwards of one `rows` context apply."""

    present: tuple[str, ...]  # the batch's adapters, each once (block order)
    index: torch.Tensor  # [batch] 1 + place in `present` (0 = base row)
    masked: bool  # rows differ in adapter (or some are base): keep each row's own block only
    picks: dict  # the composition's per-module picks (shared while the composition holds)
    select: dict = field(default_factory=dict)  # signature -> [batch, 1, sum r] 0/1


class RowLoRA:
    """Adapters as blocks per module plus the forward hooks that apply them per row.

    Subclasses fill `_adapters` (`_set` / `_drop`); `rows` is the context of one batch."""

    def __init__(self, compositions: int = 4) -> None:
        self._adapters: dict[str, Blocks] = {}
        self._serial: dict[str, int] = {}  # changes when a name is (re)loaded
        self._counter = itertools.count(1)
        self._hooks: dict[torch.nn.Module, object] = {}  # module -> hook handle
        self._compositions = compositions
        self._picked: OrderedDict[tuple, dict] = OrderedDict()  # composition -> module -> pick
        self._local = threading.local()  # each thread's own `rows` context

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
        return RowLoRA(self._compositions)

    def _set(self, name: str, blocks: Blocks) -> None:
        self._adapters[name] = blocks
        self._serial[name] = next(self._counter)
        for module in blocks:
            if module not in self._hooks:
                self._hooks[module] = module.register_forward_hook(self._hook)

    def _drop(self, name: str) -> None:
        del self._adapters[name], self._serial[name]
        used = {m for blocks in self._adapters.values() for m in blocks}
        for module in [m for m in self._hooks if m not in used]:
            self._hooks.pop(module).remove()
        self._picked.clear()

    def _drop_all(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._adapters, self._serial, self._hooks = {}, {}, {}
        self._picked.clear()

    @contextlib.contextmanager
    def rows(self, names: list[str]):
        """Apply names[b] to row b (one name: every row) in the forwards inside; nests."""
        present = tuple(sorted({n for n in names if n != BASE_ADAPTER}))
        place = {name: j + 1 for j, name in enumerate(present)}
        index = torch.tensor([place.get(n, 0) for n in names])
        masked = len(present) > 1 or BASE_ADAPTER in names
        picks = self._composition(present) if present else {}
        outer, self._now = self._now, _Forward(present, index, masked, picks)
        try:
            yield
        finally:
            self._now = outer

    def _composition(self, present: tuple[str, ...]) -> dict:
        """The per-module picks of these adapters (the last few compositions are kept)."""
        key = tuple(self._serial[n] for n in present)
        picks = self._picked.get(key)
        if picks is None:
            picks = self._picked[key] = {}
            while len(self._picked) > self._compositions:
                self._picked.popitem(last=False)
        self._picked.move_to_end(key)
        return picks

    def _pick(self, module, now: _Forward):
        """(A [sum r, in], B [out, sum r], signature ((place, r), ...)) of the batch's adapters
        on this module, or None when none of them touches it. One adapter: views, no copy."""
        if module in now.picks:
            return now.picks[module]
        members = [
            (place, self._adapters[name][module])
            for place, name in enumerate(now.present, 1)
            if module in self._adapters[name]
        ]
        pick = None
        if len(members) == 1:
            place, (a, b) = members[0]
            pick = a, b, ((place, a.shape[0]),)
        elif members:
            a = torch.cat([a for _, (a, _) in members])
            b = torch.cat([b for _, (_, b) in members], dim=1)
            pick = a, b, tuple((place, a.shape[0]) for place, (a, _) in members)
        now.picks[module] = pick
        return pick

    @staticmethod
    def _selector(now: _Forward, signature: tuple, like: torch.Tensor) -> torch.Tensor:
        """[batch, 1, sum r]: 1 on each row's own adapter block. Example: index [2, 0, 1],
        signature ((1, 1), (2, 2)) -> [[[0, 1, 1]], [[0, 0, 0]], [[1, 0, 0]]]."""
        select = now.select.get(signature)
        if select is None:
            cols = [(now.index == place)[:, None].expand(-1, r) for place, r in signature]
            select = now.select[signature] = torch.cat(cols, dim=1)[:, None].to(like)
        return select

    @torch.inference_mode()
    def _hook(self, module, inputs, output):
        now = self._now
        if now is None or not now.present:
            return None
        pick = self._pick(module, now)
        if pick is None:
            return None
        a, b, signature = pick  # [sum r, in], [out, sum r]
        x = inputs[0].to(a.dtype)  # [batch, q, in]
        low = torch.nn.functional.linear(x, a)  # [batch, q, sum r]: every present adapter's
        if now.masked:
            low = low * self._selector(now, signature, low)  # only the row's own block stays
        return output + torch.nn.functional.linear(low, b).to(output.dtype)  # [batch, q, out]


class PeftRows(RowLoRA):
    """RowLoRA over a peft model's own LoRA layers (copies B x scaling; restacks when adapters
    are added, removed or reloaded). peft's LoRA is off inside `rows`: the hooks add it. The
    only peft internals read (`lora_A`, `lora_B`, `scaling`, `lora_variant`, `_disable_adapters`)
    are read here, pinned by tests/engine/test_lora_batch.py."""

    def __init__(self, model, compositions: int = 4) -> None:
        super().__init__(compositions)
        self._model = weakref.ref(model)  # kept by the model, never keeps it
        self._key: tuple | None = None

    @contextlib.contextmanager
    def rows(self, names: list[str]):
        self._sync()
        layers = list(self._hooks)
        before = [m._disable_adapters for m in layers]
        for m in layers:  # peft's own LoRA off (peft's disable_adapter context is slow)
            m._disable_adapters = True
        try:
            with super().rows(names):
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
