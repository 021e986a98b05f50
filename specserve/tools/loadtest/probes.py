"""What the server says about itself: `specserve_replica_batch` figures in a `/metrics` scrape
(parsed by prometheus_client), the gateway's in-flight count (`/healthz`), where a level's time
went in the engine loop (`engine_share`), and `seconds_to_zero` for drains."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from specserve.platform.api.metrics import LOOP_TOTALS
from specserve.tools.loadtest.client import fetch

ACTIVE_FIGURES = ("decoding", "waiting", "prefilling")
BATCH_METRIC = "specserve_replica_batch"


def prom_values(text: str, name: str, labels: dict[str, str] | None = None) -> list[float]:
    """Values of samples named `name` whose labels include `labels`, from Prometheus text.

    Example: 'm{a="x",b="y"} 3.0' with name "m", labels {"a": "x"} -> [3.0].
    """
    wanted = (labels or {}).items()
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= sample.labels.items()
    ]


def _figure(text: str, figure: str) -> list[float]:
    """One `specserve_replica_batch` figure's values, one per replica reporting it."""
    return prom_values(text, BATCH_METRIC, {"figure": figure})


def batch_active(text: str) -> float:
    """Requests the replicas hold: decoding + waiting + prefilling (unknown ones, -1, skipped)."""
    return sum(v for figure in ACTIVE_FIGURES for v in _figure(text, figure) if v >= 0)


def kv_reserved(text: str) -> float | None:
    """The largest `kv_reserved_tokens` over replicas; None when no replica reports one."""
    values = [v for v in _figure(text, "kv_reserved_tokens") if v >= 0]
    return max(values) if values else None


def engine_figures(text: str | None) -> dict[str, float] | None:
    """The replicas' cumulative engine-loop figures, summed over replicas; None when unknown."""
    if text is None:
        return None
    figures = {figure: _figure(text, figure) for figure in LOOP_TOTALS}
    if not all(values and min(values) >= 0 for values in figures.values()):
        return None
    return {figure: sum(values) for figure, values in figures.items()}


def engine_share(before: dict | None, after: dict | None, seconds: float) -> dict | None:
    """Where a level's wall time went in the engine loop, from figures scraped around it.

    Example: 100 decode steps of 16 rows in 12 s and 4,000 prompt tokens in 6 s over 20 s ->
    busy 0.9, decode 120 ms per step at 16 rows, prefill 1.5 ms per prompt token.
    """
    if before is None or after is None or seconds <= 0:
        return None
    d = {k: after[k] - before[k] for k in LOOP_TOTALS}
    steps, tokens = d["decode_steps"], d["prefill_tokens"]
    return {
        "busy_fraction": round((d["decode_seconds"] + d["prefill_seconds"]) / seconds, 3),
        "decode_steps": int(steps),
        "rows_per_step": round(d["decode_rows"] / steps, 2) if steps else None,
        "decode_ms_per_step": round(1000 * d["decode_seconds"] / steps, 1) if steps else None,
        "prefill_ms_per_token": round(1000 * d["prefill_seconds"] / tokens, 2) if tokens else None,
        "prefill_fraction": round(d["prefill_seconds"] / seconds, 3),
    }


def gateway_inflight(url: str) -> int | None:
    """The gateway's in-flight requests, summed over base models (`/healthz`)."""
    text = fetch(url, "/healthz")
    try:
        return sum(json.loads(text)["inflight"].values()) if text else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def replica_active(url: str) -> float | None:
    """`batch_active` of a fresh `/metrics` scrape; None when it cannot be read."""
    text = fetch(url, "/metrics")
    return None if text is None else batch_active(text)


def replica_kv_reserved(url: str) -> float | None:
    """`kv_reserved` of a fresh `/metrics` scrape."""
    text = fetch(url, "/metrics")
    return None if text is None else kv_reserved(text)


def seconds_to_zero(
    probes: dict[str, Callable[[], float | None]],
    poll_s: float,
    limit_s: float = 30.0,
    started: float | None = None,
) -> dict[str, float | None]:
    """Poll each probe every `poll_s` until it reads 0; seconds it took, None past `limit_s`.

    Seconds count from `started` (a `time.perf_counter()` reading; default: now).
    """
    started = time.perf_counter() if started is None else started
    out: dict[str, float | None] = {name: None for name in probes}
    while True:
        elapsed = time.perf_counter() - started
        for name, probe in probes.items():
            if out[name] is None and probe() == 0:
                out[name] = round(elapsed, 3)
        if all(v is not None for v in out.values()) or elapsed > limit_s:
            return out
        time.sleep(poll_s)
