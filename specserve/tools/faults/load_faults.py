"""Scenarios that break something under steady load (`under_load`: workers back to back, the fault
after a warm-up, the load kept up `window_s` past it): redis_kill (SIGKILL of the embedded
redis-server; the supervisor restarts it) and controller_kill (SIGKILL of Serve's controller)."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field

from specserve.env import EnvVar
from specserve.platform.rayserve.up import embedded_redis_dir
from specserve.tools.faults.context import Context, build_report, first_error, no_broken
from specserve.tools.faults.outcome import RequestResult
from specserve.tools.faults.procs import (
    controllers,
    kill,
    listens_on,
    only,
    redis_servers,
    replicas,
    store_urls,
)
from specserve.tools.faults.report import FaultReport
from specserve.tools.faults.traffic import Watch, first_success, store_down, traffic_load
from specserve.tools.faults.traffic import store_ok as healthz_store_ok

HEALTHZ_CACHE_S = 2.0  # /healthz pings the store at most this often


class Measured(BaseModel):
    """What a fault under load found besides the load's own results."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    ok: bool = True  # the scenario's own condition (no_broken is checked on top)
    notes: list[str] = Field(default_factory=list)
    detect_s: float | None = None
    detect_by: str = ""
    recover_s: float | None = None
    recover_by: str = ""
    figures: dict = Field(default_factory=dict)
    probes: list[RequestResult] = Field(default_factory=list)


def under_load(
    ctx: Context,
    scenario: str,
    expectation: str,
    fault: Callable[[float], Measured],
    model: str | None = None,
    summarize: Callable[[list[RequestResult]], dict] | None = None,
) -> FaultReport:
    """Load on `model` (default: the base model), `fault(fault_at)` after the warm-up, the load
    kept up until `window_s` past the fault, then stopped (requests in flight finish)."""
    s, started = ctx.settings, time.monotonic()
    load = traffic_load(ctx.traffic, s.streams, s.load_limit, model).start()
    time.sleep(s.warmup_s)
    fault_at = time.monotonic()
    try:
        measured = fault(fault_at)
    except (LookupError, ValueError, OSError) as err:
        measured = Measured(ok=False, notes=[f"the fault failed: {err}"])
    time.sleep(max(0.0, fault_at + s.window_s - time.monotonic()))
    results = load.stop()
    report = build_report(
        scenario,
        results,
        measured.probes,
        started,
        ok=measured.ok,
        expectation=expectation,
        detect_s=measured.detect_s,
        detect_by=measured.detect_by,
        recover_s=measured.recover_s,
        recover_by=measured.recover_by,
        figures=measured.figures
        | {"first_error_s": first_error(results, fault_at)}
        | (summarize(results) if summarize else {}),
        notes=measured.notes,
    )
    report.ok = report.ok and no_broken(report.counts)
    return report


def pool_url(ctx: Context) -> str:
    """The n-gram pool store a ModelServer replica was given (SPECSERVE_POOL_REDIS_URL, else
    REDIS_URL, from its environment)."""
    urls = store_urls(only(replicas(ctx.scope), "ModelServer replica"))
    url = urls.get(EnvVar.POOL_REDIS_URL) or urls.get(EnvVar.REDIS_URL)
    if not url:
        raise LookupError("the replica has no REDIS_URL: not a redis store")
    return url


def embedded_redis(ctx: Context) -> list[psutil.Process]:
    """The `up`'s redis-server: by its data directory when the cache is known, else by the port of
    the store URL a replica was given."""
    if ctx.cache_dir is not None:
        return redis_servers(ctx.scope, embedded_redis_dir(Path(ctx.cache_dir)))
    port = urllib.parse.urlsplit(pool_url(ctx)).port
    return [p for p in redis_servers(ctx.scope) if port and listens_on(p, port)]


def _kill_redis(ctx: Context, fault_at: float) -> Measured:
    """SIGKILL the redis-server; watch (on threads) for /healthz to see the store down, for a new
    redis-server and for /healthz to say ok past its cache, while probes wait for a request."""
    limit, url = ctx.settings.recover_limit_s, ctx.url
    victim = only(embedded_redis(ctx), "embedded redis-server")
    down = Watch(lambda: store_down(url), fault_at, limit).start()
    kill(victim)
    restarted = Watch(
        lambda: any(p.pid != victim.pid for p in embedded_redis(ctx)), fault_at, limit
    ).start()

    def store_back() -> bool:  # an "ok" read within HEALTHZ_CACHE_S of the restart may be stale
        back = restarted.seconds
        since = time.monotonic() - fault_at
        return back is not None and since > back + HEALTHZ_CACHE_S and healthz_store_ok(url)

    ok = Watch(store_back, fault_at, limit).start()
    fresh_s, probes = first_success(ctx.traffic, fault_at, limit)
    restarted_s, ok_s = restarted.wait(), ok.wait()
    return Measured(
        ok=restarted_s is not None and ok_s is not None and fresh_s is not None,
        notes=[f"SIGKILL redis-server pid {victim.pid}"],
        detect_s=down.stop(),
        detect_by="/healthz store down",
        recover_s=ok_s,
        recover_by="/healthz store ok",
        figures={"redis_restarted_s": restarted_s, "fresh_request_s": fresh_s},
        probes=probes,
    )


def redis_kill(ctx: Context) -> FaultReport:
    expectation = (
        "the supervisor restarts redis-server and /healthz says the store is ok again; no "
        "request lost or hung"
    )
    return under_load(ctx, "redis_kill", expectation, lambda at: _kill_redis(ctx, at))


def _kill_controller(ctx: Context, fault_at: float) -> Measured:
    limit = ctx.settings.recover_limit_s
    victim = only(controllers(ctx.scope), "ServeController")
    kill(victim)
    back = Watch(
        lambda: any(p.pid != victim.pid for p in controllers(ctx.scope)), fault_at, limit
    ).start()
    recover_s, probes = first_success(ctx.traffic, fault_at, limit)
    back_s = back.wait()
    return Measured(
        ok=recover_s is not None and back_s is not None,
        notes=[f"SIGKILL ServeController pid {victim.pid}"],
        recover_s=recover_s,
        recover_by="fresh request",
        figures={"controller_restarted_s": back_s},
        probes=probes,
    )


def controller_kill(ctx: Context) -> FaultReport:
    expectation = (
        "the data plane keeps serving without the controller (Ray restarts it); no request "
        "lost or hung"
    )
    report = under_load(ctx, "controller_kill", expectation, lambda at: _kill_controller(ctx, at))
    if report.counts.completed != report.counts.sent:
        report.notes.append("some requests did not complete while the controller was down")
    return report
