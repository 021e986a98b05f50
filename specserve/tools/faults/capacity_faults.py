"""Scenarios on admission and shutdown: overload_3x (3x a replica's capacity at once: the excess
answered 503 + Retry-After, nothing lost) and graceful_stop (SIGTERM to the suite's `up` with
streams in flight: they finish, new requests get 503 shutting_down, `up` exits 0). Run last."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from specserve.engine.batch.settings import BatchSettings
from specserve.tools.faults.context import Context, build_report, no_broken
from specserve.tools.faults.outcome import RequestResult
from specserve.tools.faults.report import FaultReport
from specserve.tools.faults.traffic import Streams, first_success

REFUSED = (429, 503)


def replica_capacity(config: Path, model: str) -> tuple[int, str]:
    """(requests the model's replicas hold at once, how it was counted) from a Serve config: per
    replica min(max_ongoing_requests, batch.max_batch + batch.max_queue), times the replicas it
    starts with, plus Serve's max_queued_requests."""
    raw = yaml.safe_load(Path(config).read_text())
    (app,) = raw["applications"]
    batch = BatchSettings(**((app.get("args") or {}).get("batch") or {}))
    engine = batch.max_batch + batch.max_queue
    options = next(
        (d for d in app.get("deployments") or [] if d.get("name") == f"ModelServer-{model}"), {}
    )
    ongoing = options.get("max_ongoing_requests") or engine
    queued = max(0, options.get("max_queued_requests") or 0)
    replicas = options.get("num_replicas") or (options.get("autoscaling_config") or {}).get(
        "min_replicas", 1
    )
    held = replicas * min(ongoing, engine) + queued
    how = (
        f"{replicas} x min(max_ongoing_requests {ongoing}, max_batch + max_queue {engine}) "
        f"+ max_queued_requests {queued}"
    )
    return held, how


def overload_3x(ctx: Context) -> FaultReport:
    s, started = ctx.settings, time.monotonic()
    if s.capacity is not None:
        capacity, how = s.capacity, "--capacity"
    elif ctx.config is not None:
        capacity, how = replica_capacity(ctx.config, ctx.model)
    else:
        raise LookupError("overload_3x needs --capacity or --config")
    clients = int(s.overload_factor * capacity)
    results = Streams([ctx.traffic.spec(i) for i in range(clients)]).start().join()
    recover_s, probes = first_success(ctx.traffic, time.monotonic(), s.recover_limit_s)
    refused = [r for r in results if r.status in REFUSED]
    other = [r for r in results if r.outcome == "failed_with_error" and r.status not in REFUSED]
    report = build_report(
        "overload_3x",
        results,
        probes,
        started,
        ok=False,
        expectation="the excess is answered 503/429 + Retry-After at once; none lost or hung",
        recover_s=recover_s,
        recover_by="fresh request after the burst",
        figures={
            "capacity": capacity,
            "clients": clients,
            "excess": clients - capacity,
            "refused": len(refused),
            "refused_with_retry_after": sum(r.retry_after is not None for r in refused),
            "refused_max_s": round(max((r.ended - r.started for r in refused), default=0.0), 3),
            "other_errors": len(other),
        },
        notes=[f"capacity {capacity}: {how}"],
    )
    report.ok = (
        no_broken(report.counts)
        and bool(refused)
        and all(r.retry_after is not None for r in refused)
        and not other
        and report.counts.completed > 0
    )
    return report


def _shutting_down(result: RequestResult) -> bool:
    return result.outcome == "failed_with_error" and result.error_code == "shutting_down"


def graceful_stop(ctx: Context) -> FaultReport:
    s, started = ctx.settings, time.monotonic()
    if ctx.up is None:
        return FaultReport(
            scenario="graceful_stop", ok=False, skipped=True, notes=["needs the suite's own up"]
        )
    streams = Streams([ctx.traffic.spec(i) for i in range(s.streams)]).start()
    streaming = streams.wait_streaming(ctx.traffic.probe_deadline_s)
    fault_at = time.monotonic()
    ctx.up.terminate()
    time.sleep(0.5)  # the signal handled
    new = Streams([ctx.traffic.spec(s.streams + i) for i in range(max(1, s.after))]).start()
    inflight, fresh = streams.join(), new.join()
    code = ctx.up.wait_exit(s.stop_limit_s)
    exit_s = round(time.monotonic() - fault_at, 3) if code is not None else None
    refused = [r for r in fresh if r.status == 503 and r.error_code == "shutting_down"]
    good_inflight = [r for r in inflight if r.outcome == "completed" or _shutting_down(r)]
    report = build_report(
        "graceful_stop",
        inflight + fresh,
        [],
        started,
        ok=False,
        expectation="in-flight streams finish (or end shutting_down), new requests get 503 "
        "shutting_down + Retry-After, `up` exits 0",
        detect_s=round(min(r.ended for r in refused) - fault_at, 3) if refused else None,
        detect_by="first 503 shutting_down",
        figures={
            "streaming_at_fault": streaming,
            "inflight_completed": sum(r.outcome == "completed" for r in inflight),
            "inflight_shutting_down": sum(map(_shutting_down, inflight)),
            "new_sent": len(fresh),
            "new_503_shutting_down": len(refused),
            "new_with_retry_after": sum(r.retry_after is not None for r in refused),
            "new_unreachable": sum(r.outcome == "unreachable" for r in fresh),
            "new_completed": sum(r.outcome == "completed" for r in fresh),
            "exit_code": code,
            "exit_s": exit_s,
        },
        notes=["SIGTERM to `specserve up`"],
    )
    report.ok = (
        no_broken(report.counts)
        and len(good_inflight) == len(inflight)
        and len(refused) == len(fresh)
        and code == 0
    )
    return report
