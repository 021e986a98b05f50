"""Adapters resident on one shared base model: validated, loaded through peft, evicted LRU.

`ResidentAdapters.ensure(name, path)` validates and loads an adapter under `name` (a variant@version)
or just marks it recently used; eviction keeps the count and the weight bytes within the limits
and never drops an adapter that a request holds (`hold`). `stats` feeds the metrics layer.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import peft
import safetensors.torch

from specserve.adapters.errors import AdapterCapacityError, SizeLimitError, UnsupportedAdapterError
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec, ValidatedAdapter, validate_adapter
from specserve.engine.lora import BASE_ADAPTER

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-@]{0,127}")


@dataclass
class AdapterStats:
    """Counters for metrics: loads, hits, evictions, refusals and load time."""

    loads: int = 0
    hits: int = 0
    evictions: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # error code -> count
    load_seconds_total: float = 0.0
    last_load_seconds: float = 0.0


@dataclass
class _Resident:
    adapter: ValidatedAdapter
    n_bytes: int  # bytes of its LoRA parameters as loaded
    holds: int = 0


class ResidentAdapters:
    """The LRU of LoRA adapters on one base model. `model` is what to run forwards on: the base
    until the first adapter loads, then (for good) the peft wrapper, which serves base rows as
    `BASE_ADAPTER`."""

    def __init__(self, base_model, base_names: list[str], limits: AdapterLimits) -> None:
        self.limits = limits
        self.spec = BaseModelSpec.of(base_model, base_names)  # from the unwrapped base
        self.model = base_model
        self.stats = AdapterStats()
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # least recent first
        self._lock = threading.RLock()

    @property
    def names(self) -> list[str]:
        return list(self._resident)

    @property
    def resident_bytes(self) -> int:
        return sum(r.n_bytes for r in self._resident.values())

    def ensure(self, name: str, path: str | Path) -> ValidatedAdapter:
        """Make `name` resident (validating and loading `path` if it is not) and most recent."""
        if name == BASE_ADAPTER or not _NAME.fullmatch(name):
            raise ValueError(
                f"adapter name {name!r}: use letters, digits, '_', '-', '@' ({BASE_ADAPTER!r} is reserved)"
            )
        with self._lock:
            if name in self._resident:
                self._resident.move_to_end(name)
                self.stats.hits += 1
                return self._resident[name].adapter
            try:
                adapter = validate_adapter(path, self.spec, self.limits)
                self._make_room(adapter.n_bytes)
            except Exception as err:
                code = getattr(err, "code", type(err).__name__)
                self.stats.refusals[code] = self.stats.refusals.get(code, 0) + 1
                raise
            started = time.perf_counter()
            n_bytes = self._load(name, adapter)
            self._resident[name] = _Resident(adapter, n_bytes)
            self._evict_over_limits(keep=name)
            seconds = time.perf_counter() - started
            self.stats.loads += 1
            self.stats.load_seconds_total += seconds
            self.stats.last_load_seconds = seconds
            return adapter

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """Keep `name` resident while a request decodes with it."""
        with self._lock:
            if name not in self._resident:
                raise KeyError(f"adapter {name!r} is not resident; resident: {self.names}")
            self._resident[name].holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._resident[name].holds -= 1

    def _make_room(self, n_bytes: int) -> None:
        """Refuse now (before loading) if evicting every unheld adapter would not be enough."""
        if n_bytes > self.limits.max_resident_bytes:
            raise SizeLimitError(
                f"adapter weights ({n_bytes} bytes) exceed the resident limit {self.limits.max_resident_bytes}"
            )
        held = [r for r in self._resident.values() if r.holds]
        if len(held) + 1 > self.limits.max_resident or sum(r.n_bytes for r in held) + n_bytes > (
            self.limits.max_resident_bytes
        ):
            raise AdapterCapacityError(
                f"all {len(held)} resident adapters are in use; cannot load another now"
            )

    def _evict_over_limits(self, keep: str) -> None:
        """Unload least-recently-used unheld adapters until count and bytes fit (never `keep`)."""
        for victim in list(self._resident):
            over = len(self._resident) > self.limits.max_resident or (
                self.resident_bytes > self.limits.max_resident_bytes
            )
            if not over:
                return
            if victim != keep and not self._resident[victim].holds:
                self.model.delete_adapter(victim)  # a newer adapter stays, so peft keeps one active
                del self._resident[victim]
                self.stats.evictions += 1

    def _load(self, name: str, adapter: ValidatedAdapter) -> int:
        """Inject `adapter` under `name` from the validated bytes; returns its parameter bytes."""
        fields = {k: v for k, v in adapter.config.items() if k not in ("peft_type", "auto_mapping")}
        try:
            config = peft.LoraConfig(**fields)
        except (TypeError, ValueError) as err:
            raise UnsupportedAdapterError(
                f"adapter config is not a LoRA config peft accepts: {err}"
            ) from None
        config.inference_mode = True
        config.init_lora_weights = True  # B = 0: a targeted module without weights stays a no-op
        state = safetensors.torch.load(adapter.weights)
        if isinstance(self.model, peft.PeftModel):
            self.model.add_adapter(name, config)
        else:
            self.model = peft.get_peft_model(self.model, config, adapter_name=name)
        peft.set_peft_model_state_dict(self.model, state, adapter_name=name)
        self.model.eval()
        placed = sum(
            1 for n, _ in self.model.named_parameters() if n.endswith(f"lora_A.{name}.weight")
        )
        if placed * 2 != len(state):
            self.model.delete_adapter(name)
            raise UnsupportedAdapterError(
                f"peft placed {placed} LoRA modules for {len(state)} tensors"
            )
        params = [p for n, p in self.model.named_parameters() if f".{name}." in n]
        for p in params:
            p.requires_grad_(False)
        return sum(p.numel() * p.element_size() for p in params)


def base_model_names(model_id: str) -> list[str]:
    """Names an adapter may give for this base: the served id and, for a catalog model, its
    upstream Hugging Face id (e.g. smollm2-135m and HuggingFaceTB/SmolLM2-135M-Instruct)."""
    from specserve.engine.models import load_catalog

    entry = load_catalog().get(model_id)
    return [model_id] + ([entry.upstream] if entry and entry.upstream else [])
