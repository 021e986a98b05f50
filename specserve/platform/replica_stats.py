"""What one model-server replica reports (`ModelService.stats`, completed by `ModelServer.stats`
under Ray): the typed figures metrics and /healthz read, crossing the Ray boundary as this model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from specserve.engine.batch.stats import BatchStats
from specserve.platform.batch_compile import CompileState


class AdapterFigures(BaseModel):
    """The replica's resident adapters: how many, their bytes and budget, and LRU counters."""

    model_config = ConfigDict(frozen=True)

    resident: int
    resident_bytes: int
    budget_bytes: int
    loads: int
    evictions: int
    load_seconds_total: float
    variant_cache_size: int | None = None  # Serve's multiplexing cache (None: no Serve here)


class Numerics(BaseModel):
    """How the replica's forward computes: its dtype (and why, when chosen by `auto`), and
    whether it is the position-invariant forward (one output per request whatever the batch)."""

    model_config = ConfigDict(frozen=True)

    dtype: str
    dtype_reason: str | None = None
    invariant: bool
    invariant_reason: str


class PoolStats(BaseModel):
    """The replica's n-gram pool sync."""

    model_config = ConfigDict(frozen=True)

    sync_ok: bool  # False while the sync cannot reach its store


class ReplicaStats(BaseModel):
    """One replica's figures: requests in flight, its engine loop, adapters, numerics, and under
    Ray its compiled forward and pool sync (None where the replica has none)."""

    model_config = ConfigDict(frozen=True)

    ongoing: int
    cancelled: int  # requests stopped before they finished
    batch: BatchStats
    adapters: AdapterFigures
    numerics: Numerics
    compile: CompileState | None = None
    pools: PoolStats | None = None
