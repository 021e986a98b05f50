"""Adapters held as plain tensors beside one base model, applied per row by `lora_rows`.

`attach_store(model)` gives the model's one `LoRAStore`; `store.add(name, tensors)` takes
{Linear module name: (A [r, in], B [out, r] with scaling folded in)} and `remove` drops it. No peft
injection: an add is a dict insert whatever the resident count, and each adapter costs exactly its
own tensor bytes. Adds and removes must not run during a forward of the model (the engine thread
does them between steps).
"""

from __future__ import annotations

import weakref

import torch

from specserve.engine.lora.batch import _ROWS, BASE_ADAPTER, RowLoRA, is_peft_model

Tensors = dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> A [r, in], B [out, r]


class LoRAStore(RowLoRA):
    """The resident adapters of one plain base model (see module docstring)."""

    def __init__(self, model) -> None:
        super().__init__()
        self._model = weakref.ref(model)  # the store is the model's, not its owner
        self._bytes: dict[str, int] = {}

    def add(self, name: str, tensors: Tensors) -> int:
        """Hold `tensors` under `name` (replacing an adapter of that name); returns their bytes."""
        if name == BASE_ADAPTER or not name:
            raise ValueError(f"adapter name {name!r} is reserved")
        blocks = {self._linear(module): pair for module, pair in tensors.items()}
        for module, (a, b) in blocks.items():
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
                raise ValueError(f"{name}: A {tuple(a.shape)} and B {tuple(b.shape)} do not pair")
            if (b.shape[0], a.shape[1]) != (module.out_features, module.in_features):
                raise ValueError(
                    f"{name}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit Linear "
                    f"{module.out_features}x{module.in_features}"
                )
        if name in self._adapters:
            self.remove(name)
        self._set(name, blocks)
        self._bytes[name] = sum(t.numel() * t.element_size() for p in blocks.values() for t in p)
        return self._bytes[name]

    def remove(self, name: str) -> None:
        self._drop(name)
        del self._bytes[name]

    def bytes_of(self, name: str) -> int:
        return self._bytes[name]

    @property
    def resident_bytes(self) -> int:
        return sum(self._bytes.values())

    def _linear(self, module_name: str) -> torch.nn.Linear:
        try:
            module = self._model().get_submodule(module_name)
        except AttributeError:
            raise ValueError(f"the base model has no module {module_name!r}") from None
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"module {module_name!r} is a {type(module).__name__}, not a Linear")
        return module


def store_dtype(base_dtype: torch.dtype) -> torch.dtype:
    """The dtype adapter tensors are held in: float32 over a 16-bit base (what peft's
    autocast_adapter_dtype does), else the base's. Example: bfloat16 -> float32."""
    return torch.float32 if base_dtype in (torch.float16, torch.bfloat16) else base_dtype


def attach_store(model) -> LoRAStore:
    """The LoRAStore of a plain (not peft-wrapped) model, created on first use."""
    if is_peft_model(model):
        raise ValueError("a peft-wrapped model holds its own adapters; attach to the base model")
    store = _ROWS.get(model)
    if store is None:
        store = _ROWS[model] = LoRAStore(model)
    return store


def store_of(model) -> LoRAStore | None:
    store = _ROWS.get(model)
    return store if isinstance(store, LoRAStore) else None
