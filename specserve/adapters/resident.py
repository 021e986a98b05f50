"""Adapters resident on one shared base model: validated, held as tensors in its LoRAStore, evicted
least-recently-used within a byte budget (a share of free memory), never while a request holds one.

`prepare(name, path, sha256)` validates, checks the bytes read against the registered sha256 and
builds the tensors (any thread: file reads, hashing and conversion stay off the decode loop);
`install(prepared)` hands them to the store (the engine thread, between steps: a dict insert).
`ensure` does both. `stats` feeds the metrics layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specserve.adapters.errors import AdapterCapacityError, AdapterDigestError, SizeLimitError
from specserve.adapters.memory import budget_bytes, reference_adapter_bytes
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.tensors import adapter_tensors, store_dtype
from specserve.adapters.validate import BaseModelSpec, ValidatedAdapter, validate_adapter
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.lora.store import attach_store
from specserve.models.catalog import load_catalog

log = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-@]{0,127}")
PENDING_LIMIT = 64  # prepared adapters awaiting their hand-over, at most


@dataclass
class AdapterStats:
    """Counters for metrics: loads, hits, evictions, refusals and load time."""

    loads: int = 0
    hits: int = 0
    evictions: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # error code -> count
    load_seconds_total: float = 0.0
    last_load_seconds: float = 0.0


@dataclass(frozen=True)
class PreparedAdapter:
    """An adapter validated and converted, ready to install (its file bytes already dropped)."""

    name: str
    adapter: ValidatedAdapter  # weights=b"": the tensors below are what stays resident
    tensors: dict
    n_bytes: int
    seconds: float  # validation and conversion time


@dataclass
class _Resident:
    adapter: ValidatedAdapter
    n_bytes: int  # bytes of its tensors in the store
    holds: int = 0


class ResidentAdapters:
    """The resident adapters of one base model. `model` never changes: the plain base, whose
    `LoRAStore` applies each row's adapter (`lora_batch.lora_rows`)."""

    def __init__(self, base_model, base_names: list[str], limits: AdapterLimits) -> None:
        self.limits = limits
        self.spec = BaseModelSpec.of(base_model, base_names)
        self.model = base_model
        self.store = attach_store(base_model)
        self.dtype = store_dtype(base_model.dtype)
        self.device = base_model.device
        self.budget_bytes = budget_bytes(limits, self.device)
        self.stats = AdapterStats()
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # least recent first
        self._lock = threading.RLock()
        self._loading: dict[str, threading.Lock] = {}  # one conversion per name at a time
        self._pending: OrderedDict[str, PreparedAdapter] = OrderedDict()  # prepared, not installed

    @property
    def names(self) -> list[str]:
        return list(self._resident)

    def __contains__(self, name: str) -> bool:
        return name in self._resident

    @property
    def resident_bytes(self) -> int:
        return sum(r.n_bytes for r in self._resident.values())

    @property
    def capacity(self) -> int:
        """How many rank-8 adapters on the family's default targets the budget holds (what
        Serve's per-replica multiplexing cache is sized by), within `max_resident`."""
        per = reference_adapter_bytes(self.spec, self.model, self.dtype)
        count = max(1, self.budget_bytes // per)
        return min(count, self.limits.max_resident or count)

    def bound_count_by_capacity(self) -> int:
        """Hold at most `capacity` adapters from now on, whatever their rank: the one count a
        replica's multiplexing cache is sized by too, so the two LRUs cannot disagree."""
        self.limits = self.limits.model_copy(update={"max_resident": self.capacity})
        return self.capacity

    def ensure(self, name: str, path: str | Path, sha256: str | None = None) -> ValidatedAdapter:
        """Make `name` resident (validating and loading `path` if it is not) and most recent."""
        while True:
            prepared = self.prepare(name, path, sha256)
            if prepared is not None:
                return self.install(prepared)
            with contextlib.suppress(KeyError):  # evicted since `prepare` looked: load it again
                return self.touch(name)

    def prepare(
        self, name: str, path: str | Path, sha256: str | None = None
    ) -> PreparedAdapter | None:
        """Validate and convert `path` for `name`; None when it is resident already. `sha256`:
        the digest registered for it (None: a local adapter with none), checked on every read from
        disk; a mismatch raises AdapterDigestError and loads nothing."""
        _check_name(name)
        with self._lock:
            lock = self._loading.setdefault(name, threading.Lock())
        with lock:  # a second request for the same cold adapter waits for the first's tensors
            if name in self._resident:
                return None
            if name in self._pending:
                return self._pending[name]
            started = time.perf_counter()
            try:
                adapter = validate_adapter(path, self.spec, self.limits)
                _check_digest(name, adapter, sha256)
                tensors = adapter_tensors(adapter, self.dtype, self.device)
                n_bytes = sum(t.numel() * t.element_size() for p in tensors.values() for t in p)
                self._check_fits(n_bytes)
            except Exception as err:
                self._refused(err)
                raise
            light = dataclasses.replace(adapter, weights=b"")
            prepared = PreparedAdapter(name, light, tensors, n_bytes, time.perf_counter() - started)
            with self._lock:
                self._pending[name] = prepared
                while len(self._pending) > PENDING_LIMIT:  # requests gone before installing
                    self._pending.popitem(last=False)
            return prepared

    def install(self, prepared: PreparedAdapter) -> ValidatedAdapter:
        """Hand prepared tensors to the store, evicting idle adapters to fit (engine thread)."""
        with self._lock:
            if self._pending.get(prepared.name) is prepared:
                del self._pending[prepared.name]
            if prepared.name in self._resident:
                return self.touch(prepared.name)
            started = time.perf_counter()
            try:
                self._make_room(prepared.n_bytes)
            except Exception as err:
                self._refused(err)
                raise
            self.store.add(prepared.name, prepared.tensors)
            self._resident[prepared.name] = _Resident(prepared.adapter, prepared.n_bytes)
            seconds = prepared.seconds + time.perf_counter() - started
            self.stats.loads += 1
            self.stats.load_seconds_total += seconds
            self.stats.last_load_seconds = seconds
            return prepared.adapter

    def touch(self, name: str) -> ValidatedAdapter:
        """Mark a resident adapter most recent (a hit); KeyError if it is not resident."""
        with self._lock:
            if name not in self._resident:
                raise KeyError(f"adapter {name!r} is not resident")
            self._resident.move_to_end(name)
            self.stats.hits += 1
            return self._resident[name].adapter

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

    def evict(self, name: str) -> bool:
        """Drop `name` now unless a request holds it (the engine thread); True if dropped."""
        with self._lock:
            resident = self._resident.get(name)
            if resident is None or resident.holds:
                return False
            self.store.remove(name)
            del self._resident[name]
            self.stats.evictions += 1
            return True

    def _check_fits(self, n_bytes: int) -> None:
        if n_bytes > self.budget_bytes:
            raise SizeLimitError(
                f"adapter weights ({n_bytes} bytes) exceed the resident budget {self.budget_bytes}"
            )

    def _make_room(self, n_bytes: int) -> None:
        """Evict least-recently-used idle adapters until `n_bytes` more fit (bytes and count);
        refuse, evicting nothing, when even evicting every idle one would not be enough."""
        held = [r for r in self._resident.values() if r.holds]
        cap = self.limits.max_resident
        if sum(r.n_bytes for r in held) + n_bytes > self.budget_bytes or (
            cap is not None and len(held) + 1 > cap
        ):
            raise AdapterCapacityError(
                f"the {len(held)} adapters in use fill the resident budget; cannot load another now"
            )
        for victim in list(self._resident):
            over = self.resident_bytes + n_bytes > self.budget_bytes or (
                cap is not None and len(self._resident) + 1 > cap
            )
            if not over:
                return
            if not self._resident[victim].holds:
                self.store.remove(victim)
                del self._resident[victim]
                self.stats.evictions += 1

    def _refused(self, err: Exception) -> None:
        code = getattr(err, "code", type(err).__name__)
        self.stats.refusals[code] = self.stats.refusals.get(code, 0) + 1


def _check_digest(name: str, adapter: ValidatedAdapter, sha256: str | None) -> None:
    """Refuse (and log as broken) an adapter whose bytes are not the ones registered."""
    if sha256 is not None and adapter.sha256 != sha256:
        err = AdapterDigestError(
            f"adapter of {name} has sha256 {adapter.sha256[:12]}..., registered"
            f" {sha256[:12]}...: its files changed after registration; refused"
        )
        log.error("variant %s is broken, not served: %s (at %s)", name, err, adapter.path)
        raise err


def _check_name(name: str) -> None:
    if name == BASE_ADAPTER or not _NAME.fullmatch(name):
        raise ValueError(
            f"adapter name {name!r}: use letters, digits, '_', '-', '@' ({BASE_ADAPTER!r} is reserved)"
        )


def base_model_names(model_id: str) -> list[str]:
    """Names an adapter may give for this base: the served id and, for a catalog model, its
    upstream Hugging Face id (e.g. smollm2-135m and HuggingFaceTB/SmolLM2-135M-Instruct)."""
    entry = load_catalog().get(model_id)
    return [model_id] + ([entry.upstream] if entry and entry.upstream else [])


__all__ = ["AdapterStats", "PreparedAdapter", "ResidentAdapters", "base_model_names"]
