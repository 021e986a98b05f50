"""Scenarios on the registry and the pool store under load: version_bump (a new version of a
variant registered through the admin API while it serves) and pool_pressure (the n-gram pool
redis set to its maxmemory for a while, then restored)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import redis
import yaml

from specserve.tools.faults.context import Context
from specserve.tools.faults.load_faults import Measured, pool_url, under_load
from specserve.tools.faults.outcome import RequestResult
from specserve.tools.faults.report import FaultReport
from specserve.tools.faults.traffic import first_success


def adapter_root(ctx: Context) -> Path:
    """Where the server accepts adapters: --adapter-root, else the config's adapter_root, else
    `<cache>/adapters` (LookupError when none of them is known)."""
    if ctx.settings.adapter_root is not None:
        return ctx.settings.adapter_root
    if ctx.config is not None:
        (app,) = yaml.safe_load(Path(ctx.config).read_text())["applications"]
        if (app.get("args") or {}).get("adapter_root"):
            return Path(app["args"]["adapter_root"])
    if ctx.cache_dir is not None:
        return Path(ctx.cache_dir) / "adapters"
    raise LookupError("no adapter root: pass --adapter-root or --cache-dir")


def place_adapter(source: Path, root: Path, name: str) -> Path:
    """A copy of the adapter `source` at `root/name` (kept if it is there already)."""
    target = root / name
    if not target.exists():
        shutil.copytree(source, target)
    return target


def _versions(results: list[RequestResult]) -> dict:
    served = sorted({r.version for r in results if r.version is not None})
    return {"versions_served": ",".join(map(str, served))}


def version_bump(ctx: Context) -> FaultReport:
    s, variant = ctx.settings, ctx.settings.variant
    if s.adapter is None:
        raise LookupError("version_bump needs --adapter (a LoRA adapter of the base model)")
    root = adapter_root(ctx)
    first = place_adapter(s.adapter, root, f"{variant}-a")
    second = place_adapter(s.adapter, root, f"{variant}-b")
    old = ctx.admin.register(variant, ctx.model, str(first), {})["version"]
    ready_s, _ = first_success(ctx.traffic, time.monotonic(), s.recover_limit_s, model=variant)
    if ready_s is None:
        raise LookupError(f"variant {variant} (version {old}) never answered")

    def fault(at: float) -> Measured:
        new = ctx.admin.register(variant, ctx.model, str(second), {})["version"]
        registered_s = round(time.monotonic() - at, 3)
        recover_s, probes = first_success(
            ctx.traffic, at, s.recover_limit_s, lambda r: r.version == new, variant
        )
        return Measured(
            ok=recover_s is not None,
            notes=[f"registered version {new} of {variant} (was {old}) under load"],
            recover_s=recover_s,
            recover_by=f"fresh request served by version {new}",
            figures={"old_version": old, "new_version": new, "registered_s": registered_s},
            probes=probes,
        )

    expectation = "every request completes (old or new version); fresh ones get the new version"
    report = under_load(ctx, "version_bump", expectation, fault, variant, _versions)
    report.ok = report.ok and report.counts.completed == report.counts.sent
    return report


def _oom_errors(client) -> int:
    return int((client.info("errorstats").get("errorstat_OOM") or {}).get("count", 0))


def _squeeze_pool(ctx: Context, at: float) -> Measured:
    client = redis.Redis.from_url(pool_url(ctx), socket_timeout=5.0, decode_responses=True)
    try:
        policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
        before = client.config_get("maxmemory")["maxmemory"]
        used = int(client.info("memory")["used_memory"])
        oom_before = _oom_errors(client)
        client.config_set("maxmemory", used)
        try:
            time.sleep(ctx.settings.window_s)
        finally:
            client.config_set("maxmemory", before)
        restored_at = time.monotonic()
        oom = _oom_errors(client) - oom_before
    finally:
        client.close()
    recover_s, probes = first_success(ctx.traffic, restored_at, ctx.settings.recover_limit_s)
    return Measured(
        ok=recover_s is not None,
        notes=[
            (
                f"maxmemory {used} B (used_memory; policy {policy}) for "
                f"{ctx.settings.window_s} s, then {before} again; {oom} command(s) refused OOM"
            )
        ],
        recover_s=recover_s,
        recover_by="fresh request after the restore",
        figures={"maxmemory_policy": policy, "oom_errors": oom, "used_memory": used},
        probes=probes,
    )


def pool_pressure(ctx: Context) -> FaultReport:
    expectation = (
        "a full pool store costs speculation, not requests: none lost or hung, fresh requests "
        "succeed after the restore"
    )
    return under_load(ctx, "pool_pressure", expectation, lambda at: _squeeze_pool(ctx, at))
