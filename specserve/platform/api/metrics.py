"""Prometheus metrics of the gateway, in one registry per process, with bounded label cardinality.

Per request: count, errors (streams ended by an error event too), latency, time to first token, inter-token latency, generated tokens,
forwards, drafts and accepted tokens per draft position; plus adapter loads/evictions and store
health as reported by the model servers. At most `max_variants` variant labels, then "other".
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specserve.platform.events import Done
from specserve.platform.replica_stats import ReplicaStats

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)
MAX_DEPTH_LABEL = 16


# cumulative since the replica started: where the engine loop's time went (BatchStats)
LOOP_TOTALS = (
    "decode_steps",
    "decode_rows",
    "decode_seconds",
    "prefill_tokens",
    "prefill_seconds",
)
ADAPTER_FIGURES = (  # figure labels = AdapterFigures fields
    "resident",
    "resident_bytes",
    "budget_bytes",
    "variant_cache_size",
)
BATCH_FIGURES = (  # figure labels = BatchStats fields
    "waiting",
    "prefilling",
    "decoding",
    "kv_reserved_tokens",
    "draft_cap",
    *LOOP_TOTALS,
    "calls_seconds",  # loop time spent between steps on model changes (adapter hand-overs)
)


class Metrics:
    def __init__(self, max_variants: int = 50) -> None:
        self.registry = CollectorRegistry()
        self.max_variants = max_variants
        self._variants: set[str] = set()
        self._lock = threading.Lock()
        self._request_metrics(["base_model", "variant", "strategy"])
        self._replica_metrics()

    def _request_metrics(self, labels: list[str]) -> None:
        """Per-request counters and histograms, labelled by base model, variant and strategy."""
        r = self.registry
        self.requests = Counter(
            "specserve_requests", "Finished requests", [*labels, "endpoint"], registry=r
        )
        self.errors = Counter(
            "specserve_request_errors",
            "Error responses",
            ["endpoint", "status", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "specserve_request_latency_seconds",
            "Request latency",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "specserve_ttft_seconds",
            "Time to first token",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "specserve_itl_seconds", "Inter-token latency", labels, buckets=ITL_BUCKETS, registry=r
        )
        self.tokens = Counter("specserve_generated_tokens", "Generated tokens", labels, registry=r)
        self.forwards = Counter(
            "specserve_target_forwards", "Target model forwards", labels, registry=r
        )
        self.drafted = Counter(
            "specserve_draft_steps",
            "Steps drafting at least this position",
            [*labels, "position"],
            registry=r,
        )
        self.accepted = Counter(
            "specserve_accepted_steps",
            "Steps accepting at least this position",
            [*labels, "position"],
            registry=r,
        )
        self.accepted_by_source = Counter(
            "specserve_accepted_tokens_by_source",
            "Accepted draft tokens by the source that proposed them (merging strategies)",
            [*labels, "source"],
            registry=r,
        )
        self.capped_steps = Counter(
            "specserve_load_capped_steps",
            "Decode steps whose draft was cut because of the batch's load",
            labels,
            registry=r,
        )

    def _replica_metrics(self) -> None:
        """What model-server replicas report (`ReplicaStats`) and the store's health."""
        r = self.registry
        self.adapter_loads = Gauge(
            "specserve_adapter_loads", "Adapter loads", ["base_model", "replica"], registry=r
        )
        self.adapter_evictions = Gauge(
            "specserve_adapter_evictions",
            "Adapter evictions",
            ["base_model", "replica"],
            registry=r,
        )
        self.replica_adapters = Gauge(
            "specserve_replica_adapters",
            "A replica's resident adapters: count, their weight bytes, the byte budget, and the "
            "size of Serve's multiplexing cache derived from it",
            ["base_model", "replica", "figure"],
            registry=r,
        )
        self.replica_ongoing = Gauge(
            "specserve_replica_ongoing",
            "Requests decoding on a model-server replica",
            ["base_model", "replica"],
            registry=r,
        )
        self.replica_cancelled = Gauge(
            "specserve_replica_cancelled",
            "Requests a replica stopped early (client gone)",
            ["base_model", "replica"],
            registry=r,
        )
        self.replica_batch = Gauge(
            "specserve_replica_batch",
            "A replica's engine loop: requests waiting, prefilling, decoding; KV positions "
            "reserved; the draft cap load put on the last step (-1: none); since start: decode "
            "steps, rows decoded over them, seconds decoding, prompt tokens and seconds prefilling",
            ["base_model", "replica", "figure"],
            registry=r,
        )
        self.store_up = Gauge("specserve_store_up", "1 when the registry store answers", registry=r)
        self.pool_sync_degraded = Gauge(
            "specserve_pool_sync_degraded",
            "1 while n-gram pool sync cannot reach its store",
            ["replica"],
            registry=r,
        )

    def variant_label(self, variant: str | None) -> str:
        """The variant's own label while fewer than `max_variants` are known, then "other"."""
        if variant is None:
            return "base"
        with self._lock:
            if variant in self._variants or len(self._variants) < self.max_variants:
                self._variants.add(variant)
                return variant
        return "other"

    def observe_request(
        self,
        endpoint: str,
        base_model: str,
        done: Done,
        latency: float,
        ttft: float | None,
        itls: list[float],
    ) -> None:
        """Record a finished request from its final event (see ModelService)."""
        info = done.specserve
        labels = (base_model, self.variant_label(info.variant), info.strategy)
        self.requests.labels(*labels, endpoint).inc()
        self.latency.labels(*labels).observe(latency)
        if ttft is not None:
            self.ttft.labels(*labels).observe(ttft)
        for gap in itls:
            self.itl.labels(*labels).observe(gap)
        self.tokens.labels(*labels).inc(done.usage.completion_tokens)
        self.capped_steps.labels(*labels).inc(info.load_capped_steps)
        self.forwards.labels(*labels).inc(info.forwards)
        for depth, count in enumerate(info.drafted_by_depth[:MAX_DEPTH_LABEL], 1):
            self.drafted.labels(*labels, str(depth)).inc(count)
        for depth, count in enumerate(info.accepted_by_depth[:MAX_DEPTH_LABEL], 1):
            self.accepted.labels(*labels, str(depth)).inc(count)
        for source, count in info.accepted_by_source.items():
            self.accepted_by_source.labels(*labels, source).inc(count)

    def observe_error(self, endpoint: str, status: int, code: str | None) -> None:
        self.errors.labels(endpoint, str(status), code or "none").inc()

    def observe_stream_error(self, endpoint: str, code: str) -> None:
        """A stream ended by an error event (its HTTP status, sent with the first byte, was 200;
        `code` tells these apart, e.g. replica_lost)."""
        self.errors.labels(endpoint, "200", code).inc()

    def observe_replica(self, base_model: str, replica: str, stats: ReplicaStats) -> None:
        """Adapter, engine-loop and pool-sync figures a model-server replica reported."""
        adapters = stats.adapters
        self.adapter_loads.labels(base_model, replica).set(adapters.loads)
        self.adapter_evictions.labels(base_model, replica).set(adapters.evictions)
        for figure in ADAPTER_FIGURES:
            value = getattr(adapters, figure)
            if value is not None:
                self.replica_adapters.labels(base_model, replica, figure).set(value)
        self.replica_ongoing.labels(base_model, replica).set(stats.ongoing)
        self.replica_cancelled.labels(base_model, replica).set(stats.cancelled)
        sync_ok = stats.pools is None or stats.pools.sync_ok
        self.pool_sync_degraded.labels(replica).set(0 if sync_ok else 1)
        for figure in BATCH_FIGURES:
            value = getattr(stats.batch, figure)
            self.replica_batch.labels(base_model, replica, figure).set(
                -1 if value is None else value
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)
