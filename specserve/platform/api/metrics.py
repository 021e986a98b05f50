"""Prometheus metrics of the gateway, in one registry per process, with bounded label cardinality.

Per request: count, errors (streams ended by an error event too), latency, time to first token, inter-token latency, generated tokens,
forwards, drafts and accepted tokens per draft position; plus adapter loads/evictions and store
health as reported by the model servers. At most `max_variants` variant labels, then "other".
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specserve.platform.events import Done

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)
MAX_DEPTH_LABEL = 16


# cumulative since the replica started: where the engine loop's time went (Scheduler.stats)
LOOP_TOTALS = (
    "decode_steps",
    "decode_rows",
    "decode_seconds",
    "prefill_tokens",
    "prefill_seconds",
)
ADAPTER_FIGURES = {  # figure label -> ModelServer.stats key
    "resident": "adapters_resident",
    "resident_bytes": "adapter_resident_bytes",
    "budget_bytes": "adapter_budget_bytes",
    "variant_cache_size": "variant_cache_size",
}
BATCH_FIGURES = (
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
        labels = ["base_model", "variant", "strategy"]
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
        self.capped_steps = Counter(
            "specserve_load_capped_steps",
            "Decode steps whose draft was cut because of the batch's load",
            labels,
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

    def observe_replica(self, base_model: str, replica: str, stats: dict) -> None:
        """Adapter and pool-sync figures a model-server replica reported."""
        self.adapter_loads.labels(base_model, replica).set(stats.get("adapter_loads", 0))
        self.adapter_evictions.labels(base_model, replica).set(stats.get("adapter_evictions", 0))
        for figure, key in ADAPTER_FIGURES.items():
            if key in stats:
                self.replica_adapters.labels(base_model, replica, figure).set(stats[key])
        self.replica_ongoing.labels(base_model, replica).set(stats.get("ongoing", 0))
        self.replica_cancelled.labels(base_model, replica).set(stats.get("cancelled", 0))
        self.pool_sync_degraded.labels(replica).set(0 if stats.get("pool_sync_ok", True) else 1)
        for figure in BATCH_FIGURES:
            value = stats.get(f"batch_{figure}")
            self.replica_batch.labels(base_model, replica, figure).set(
                -1 if value is None else value
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)
