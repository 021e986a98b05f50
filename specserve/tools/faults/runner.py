"""`run_suite`: the chosen scenarios, in the suite's order (graceful_stop last: it ends the `up`),
against a server: the suite's own `specserve up` (started and stopped here) or `--url`'s; a
fresh request must succeed before each scenario; a scenario that raises is reported, not fatal."""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from specserve.paths import default_cache_dir
from specserve.platform.api.client import AdminClient
from specserve.tools.faults.capacity_faults import graceful_stop, overload_3x
from specserve.tools.faults.context import Context, SuiteSettings
from specserve.tools.faults.load_faults import controller_kill, redis_kill
from specserve.tools.faults.procs import Scope
from specserve.tools.faults.report import FaultReport, SuiteReport
from specserve.tools.faults.server import UpProcess, UpSettings, base_models
from specserve.tools.faults.store_faults import pool_pressure, version_bump
from specserve.tools.faults.stream_faults import engine_loop_hang, engine_loop_kill, replica_kill
from specserve.tools.faults.traffic import Traffic, first_success
from specserve.tools.loadtest.client import fetch
from specserve.tools.loadtest.probes import engine_figures, engine_share

SCENARIOS: dict[str, Callable[[Context], FaultReport]] = {
    "replica_kill": replica_kill,
    "engine_loop_kill": engine_loop_kill,
    "engine_loop_hang": engine_loop_hang,
    "redis_kill": redis_kill,
    "controller_kill": controller_kill,
    "version_bump": version_bump,
    "pool_pressure": pool_pressure,
    "overload_3x": overload_3x,
    "graceful_stop": graceful_stop,
}
RANDOM_ADAPTER = "random-r8"  # a rank-8 LoRA adapter of SmolLM2 under <default cache>/adapters


class RunSettings(BaseModel):
    """One run: which scenarios, against what (`url`, else an `up` of `config` started here with
    `cache_dir`, a temporary one by default), what it sends, and the scenarios' bounds."""

    scenarios: list[str] = Field(default_factory=lambda: list(SCENARIOS))
    url: str | None = None
    token: str | None = None
    config: Path | None = None
    cache_dir: Path | None = None
    model: str | None = None  # default: the config's first model
    max_tokens: int = Field(64, gt=0)
    deadline_s: float = Field(120.0, gt=0)
    engine_stall_s: float = Field(20.0, gt=0)
    port: int | None = None
    num_cpus: int | None = None
    start_timeout_s: float = Field(600.0, gt=0)
    suite: SuiteSettings = SuiteSettings()

    def ordered(self) -> list[str]:
        unknown = sorted(set(self.scenarios) - set(SCENARIOS))
        if unknown:
            raise ValueError(f"scenarios: unknown {unknown}; valid: {', '.join(SCENARIOS)}")
        return [name for name in SCENARIOS if name in self.scenarios]


def _temporary_cache() -> Path:
    """A fresh cache directory whose `models` is the default cache's (no second download)."""
    cache = Path(tempfile.mkdtemp(prefix="specserve-faults-"))
    models = default_cache_dir() / "models"
    if models.is_dir():
        (cache / "models").symlink_to(models)
    return cache


def _default_adapter(model: str) -> Path | None:
    path = default_cache_dir() / "adapters" / RANDOM_ADAPTER
    return path if model.startswith("smollm2") and path.is_dir() else None


def run_suite(
    settings: RunSettings,
    log: Callable[[str], None] = print,
    on_report: Callable[[SuiteReport], None] | None = None,
) -> SuiteReport:
    """Every scenario of `settings` in order; `on_report` gets the suite after each one."""
    names = settings.ordered()
    if settings.url is None and settings.config is None:
        raise ValueError("config: needed to start `specserve up` (or pass --url)")
    if settings.url is not None:
        return _run(_remote_context(settings), settings, names, log, on_report)
    cache = settings.cache_dir or _temporary_cache()
    up = UpProcess(
        UpSettings(
            config=settings.config,
            cache_dir=cache,
            token=settings.token or secrets.token_urlsafe(18),
            port=settings.port,
            num_cpus=settings.num_cpus,
            args={"engine_stall_s": settings.engine_stall_s},
            start_timeout_s=settings.start_timeout_s,
        )
    )
    log(f"faults: starting `specserve up` on {up.url} (cache {cache}, log {up.log_file})")
    up.start()
    try:
        ctx = _context(settings, up.url, up.settings.token, up.config, up=up)
        log(f"faults: up is ready after {up.wait_ready(ctx.traffic):.1f} s")
        return _run(ctx, settings, names, log, on_report)
    finally:
        code = up.stop()
        log(f"faults: `specserve up` exited with {code}")


def _context(settings, url: str, token: str, config: Path | None, up=None) -> Context:
    model = settings.model or (base_models(config)[0] if config else None)
    if model is None:
        raise ValueError("model: pass --model (or --config)")
    suite = settings.suite
    if suite.adapter is None:
        suite = suite.model_copy(update={"adapter": _default_adapter(model)})
    cache = up.settings.cache_dir if up is not None else settings.cache_dir
    traffic = Traffic(url=url, model=model, max_tokens=settings.max_tokens)
    traffic = traffic.model_copy(update={"deadline_s": settings.deadline_s})
    scope = Scope(root_pid=up.pid if up is not None else None, cache_dir=cache)
    return Context(url, model, AdminClient(url, token), traffic, scope, suite, config, up)


def _remote_context(settings: RunSettings) -> Context:
    cache = settings.cache_dir or default_cache_dir()
    admin = AdminClient.from_env(settings.url, settings.token, cache)
    return _context(settings, admin.url, admin.token, settings.config)


def _engine_pace(before: dict | None, url: str, seconds: float) -> dict:
    """Decode ms per step and rows per step over the scenario, from the replicas' /metrics
    counters (nothing when they cannot be read or restarted meanwhile: a replaced replica)."""
    after = engine_figures(fetch(url, "/metrics")) if before is not None else None
    if after is None or any(after[k] < before[k] for k in before):
        return {}
    share = engine_share(before, after, seconds) or {}
    return {k: share.get(k) for k in ("decode_ms_per_step", "rows_per_step", "busy_fraction")}


def _run(ctx: Context, settings: RunSettings, names, log, on_report) -> SuiteReport:
    suite = SuiteReport(
        url=ctx.url,
        model=ctx.model,
        config=str(ctx.config) if ctx.config else None,
        settings=settings.model_dump(mode="json", exclude={"token"}),
    )
    for name in names:
        ready_s, _ = first_success(ctx.traffic, time.monotonic(), ctx.settings.recover_limit_s)
        log(f"faults: {name} (server answering after {ready_s} s)")
        before = engine_figures(fetch(ctx.url, "/metrics"))
        try:
            report = SCENARIOS[name](ctx)
        except (LookupError, ValueError, OSError, RuntimeError) as err:
            report = FaultReport(scenario=name, ok=False, notes=[f"{type(err).__name__}: {err}"])
        if report.figures.get("replica_replaced_s") is None:  # else counters of two replicas
            report.figures |= _engine_pace(before, ctx.url, report.seconds)
        suite.reports.append(report)
        log(f"faults: {name}: ok={report.ok} {report.counts.model_dump()} notes={report.notes}")
        if on_report is not None:
            on_report(suite)
    return suite
