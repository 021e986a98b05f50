"""Per-row LoRA for a batch in two matmuls per layer (the Punica / S-LoRA idea), on peft.

peft loads, validates and holds the adapters; its own mixed-batch path loops over the adapters of
a batch in every layer. Here each LoRA Linear's resident adapters are stacked once (A as
[n, r, in], B as [out, n, r], scaling folded into B); a forward picks the blocks of the k adapters
its batch holds (A_k [k r, in], B_k [out, k r], cached per batch composition) and a hook adds
`((x @ A_k^T) * select[row]) @ B_k^T`, where select keeps only the row's own r-block, while peft's
own LoRA is off. Its cost follows the batch, not the resident count; a batch of base rows only
adds nothing. The only peft internals read (`lora_A`, `lora_B`, `scaling`, `lora_variant`) are
read here, pinned by tests/engine/test_lora_batch.py.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict

import torch

from specserve.engine.lora import BASE_ADAPTER, adapter_kwargs, is_peft_model

_BY_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lora_rows(model, adapters: list[str | None]):
    """A context in which a forward of `model` applies adapters[b] to batch row b.

    Plain models and all-None rows: nothing to do (None = the model's default, see
    `lora.adapter_kwargs`). Unknown adapters raise ValueError listing the resident ones.
    Example: `with lora_rows(model, ["support@2", BASE_ADAPTER]): model(ids)` (ids [2, q]).
    """
    kwargs = adapter_kwargs(model, adapters)  # validates names
    if not kwargs:
        return contextlib.nullcontext()
    batched = _BY_MODEL.get(model)
    if batched is None:
        batched = _BY_MODEL[model] = BatchedLoRA(model)
    return batched.rows(kwargs["adapter_names"])


class BatchedLoRA:
    """The stacked adapters and hooks of one peft model (rebuilt when its resident set changes).

    A forward computes only the adapters its batch holds: their blocks are picked out of the
    stacks once per batch composition (kept for the last few compositions; a single adapter's
    blocks are views), so its cost follows the rows and the distinct adapters in the batch, not
    the number resident."""

    def __init__(self, model, compositions: int = 4) -> None:
        self.model = model
        self._key: tuple | None = None
        self._names: dict[str, int] = {}  # adapter -> stack index (0 = none)
        self._stacks: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
        self._hooks: list = []
        self._compositions = compositions
        self._picked: OrderedDict[tuple[int, ...], dict] = OrderedDict()  # present -> per layer
        self._present: tuple[int, ...] = ()  # stack indices of this forward's adapters
        self._blocks: dict = {}  # this forward's composition: layer -> picked (A, B)
        self._index: torch.Tensor | None = None  # [batch] 1 + place in `_present` (0 = none)
        self._masked = False  # rows differ in adapter (or some have none): keep own blocks only
        self._select: dict[int, torch.Tensor] = {}  # rank -> [batch, 1, k rank] 0/1

    @contextlib.contextmanager
    def rows(self, names: list[str]):
        self._sync()
        index = [self._names.get(n, 0) for n in names]
        self._present = tuple(sorted({i for i in index if i}))
        place = {s: j + 1 for j, s in enumerate(self._present)}
        self._index = torch.tensor([place.get(i, 0) for i in index]) if self._present else None
        self._masked = len(self._present) > 1 or 0 in index
        self._blocks = self._composition() if self._present else {}
        self._select = {}
        layers = list(self._stacks)
        for m in layers:  # peft's own LoRA off: the hooks add it (peft's disable_adapter is slow)
            m._disable_adapters = True
        try:
            yield
        finally:
            for m in layers:
                m._disable_adapters = False
            self._index = None
            self._select = {}

    def _selector(self, rank: int, like: torch.Tensor) -> torch.Tensor:
        """[batch, 1, k rank]: 1 on each row's own adapter block among the k present (built once
        per rank and forward). Example: index [2, 0, 1], k 2, rank 1 -> [[[0, 1]], [[0, 0]],
        [[1, 0]]]."""
        select = self._select.get(rank)
        if select is None:
            blocks = torch.nn.functional.one_hot(self._index, 1 + len(self._present))[:, 1:]
            select = blocks.repeat_interleave(rank, dim=1)[:, None].to(like)  # [b, 1, k r]
            self._select[rank] = select
        return select

    def _composition(self) -> dict:
        """The per-layer picks of this forward's adapters (the last few compositions are kept)."""
        picked = self._picked.get(self._present)
        if picked is None:
            picked = self._picked[self._present] = {}
            while len(self._picked) > self._compositions:
                self._picked.popitem(last=False)
        self._picked.move_to_end(self._present)
        return picked

    def _pick(self, module) -> tuple[torch.Tensor, torch.Tensor]:
        """This forward's adapters' blocks of one layer: A [k r, in], B [out, k r]."""
        blocks = self._blocks.get(module)
        if blocks is None:
            a, b = self._stacks[module]  # [n, r, in], [out, n, r]
            if len(self._present) == 1:  # views, no copy
                i = self._present[0] - 1
                blocks = a[i], b[:, i]
            else:
                sel = torch.tensor(self._present, device=a.device) - 1
                blocks = a[sel].flatten(0, 1), b[:, sel].flatten(1, 2)
            self._blocks[module] = blocks
        return blocks

    def _layers(self):
        return [m for m in self.model.modules() if hasattr(m, "lora_A") and hasattr(m, "scaling")]

    def _sync(self) -> None:
        """Restack when adapters were added, removed or reloaded since the last forward."""
        first = next(iter(self._stacks), None)
        if first is not None and self._key_of(first) == self._key:
            return
        layers = self._layers()
        if not layers:
            raise ValueError("peft model without LoRA layers")
        for hook in self._hooks:
            hook.remove()
        names = sorted({name for m in layers for name in m.lora_A})
        if any(getattr(m, "_disable_adapters", True) for m in layers):
            raise RuntimeError("peft LoRA layers are disabled or lack `_disable_adapters`")
        self._names = {name: i + 1 for i, name in enumerate(names)}
        self._stacks = {m: _stack(m, names) for m in layers}
        self._picked.clear()
        self._hooks = [m.register_forward_hook(self._hook) for m in layers]
        self._key = self._key_of(layers[0])

    def _key_of(self, layer) -> tuple:
        """Resident names, and where one layer's weights live (a reload moves them)."""
        names = tuple(sorted(self.model.peft_config))
        return names, tuple(layer.lora_A[n].weight.data_ptr() for n in names if n in layer.lora_A)

    @torch.inference_mode()
    def _hook(self, module, inputs, output):
        if self._index is None:
            return None
        a, b = self._pick(module)  # [k r, in], [out, k r]
        x = inputs[0].to(a.dtype)  # [b, q, in]
        rank = a.shape[0] // len(self._present)
        low = torch.nn.functional.linear(x, a)  # [b, q, k r]: every present adapter's
        if self._masked:
            low = low * self._selector(rank, low)  # only the row's own adapter block stays
        return output + torch.nn.functional.linear(low, b).to(output.dtype)  # [b, q, out]


def _stack(module, names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """A as [n, r, in] and B as [out, n, r], block i = adapter names[i] (scaling folded into B;
    ranks zero-padded to the largest; adapters this layer lacks are zeros)."""
    held = [n for n in names if n in module.lora_A]
    for name in held:
        if name in getattr(module, "lora_variant", {}) or module.lora_B[name].bias is not None:
            raise ValueError(f"adapter {name}: only plain LoRA (no DoRA, no bias) batches here")
    ref = module.lora_A[held[0]].weight
    rank = max(module.lora_A[n].weight.shape[0] for n in held)
    fan_in = ref.shape[1]
    fan_out = module.lora_B[held[0]].weight.shape[0]
    a = torch.zeros(len(names), rank, fan_in, dtype=ref.dtype, device=ref.device)
    b = torch.zeros(fan_out, len(names), rank, dtype=ref.dtype, device=ref.device)
    for i, name in enumerate(names):
        if name in held:
            r = module.lora_A[name].weight.shape[0]
            a[i, :r] = module.lora_A[name].weight.detach()
            b[:, i, :r] = module.lora_B[name].weight.detach() * module.scaling[name]
    return a, b


__all__ = ["BASE_ADAPTER", "BatchedLoRA", "is_peft_model", "lora_rows"]
