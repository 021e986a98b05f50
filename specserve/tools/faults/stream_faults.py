"""Scenarios that break a model server while streams are in flight (`under_streams`):
replica_kill (SIGKILL of a ModelServer replica process, then requests sent just after) and the
engine-loop faults of POST /admin/faults (kill_engine_loop, hang_engine_loop)."""

from __future__ import annotations

import time
from collections.abc import Callable

from specserve.tools.faults.context import Context, build_report, first_error, no_broken
from specserve.tools.faults.procs import kill, replicas
from specserve.tools.faults.report import FaultReport
from specserve.tools.faults.traffic import Streams, Watch, first_success

STREAM_EXPECTATION = (
    "every stream ends with a finish chunk or an OpenAI error (none lost or hung); a fresh "
    "request succeeds again within the recovery bound"
)


def replica_pids(ctx: Context) -> set[int]:
    return {p.pid for p in replicas(ctx.scope)}


def under_streams(
    ctx: Context, scenario: str, fault: Callable[[], str], after: int = 0
) -> FaultReport:
    """`ctx.settings.streams` streams started; once they stream, `fault()` (its note kept), then
    `after` more requests at once; probes until a fresh request completes; every result."""
    s, started = ctx.settings, time.monotonic()
    before = replica_pids(ctx)
    streams = Streams([ctx.traffic.spec(i) for i in range(s.streams)]).start()
    streaming = streams.wait_streaming(ctx.traffic.probe_deadline_s)
    fault_at = time.monotonic()
    replaced = Watch(lambda: bool(replica_pids(ctx) - before), fault_at, s.recover_limit_s)
    replaced.start()
    notes, recover_s, probes, later = [], None, [], None
    try:
        notes.append(fault())
        later = Streams([ctx.traffic.spec(s.streams + i) for i in range(after)]).start()
        recover_s, probes = first_success(ctx.traffic, fault_at, s.recover_limit_s)
    except (LookupError, ValueError, OSError) as err:
        notes.append(f"the fault failed: {err}")
    results = streams.join() + (later.join() if later else [])
    replaced_s = replaced.stop()
    report = build_report(
        scenario,
        results,
        probes,
        started,
        ok=False,
        expectation=STREAM_EXPECTATION,
        detect_s=first_error(results + probes, fault_at),
        detect_by="first error",
        recover_s=recover_s,
        recover_by="fresh request",
        figures={
            "streaming_at_fault": streaming,
            "sent_after_fault": after,
            "replica_replaced_s": replaced_s,
        },
        notes=notes,
    )
    report.ok = no_broken(report.counts) and recover_s is not None and len(notes) == 1
    return report


def replica_kill(ctx: Context) -> FaultReport:
    def fault() -> str:
        found = replicas(ctx.scope)
        if not found:
            raise LookupError("no ModelServer replica process found")
        victim = found[0]
        kill(victim)
        return f"SIGKILL ModelServer replica pid {victim.pid} (of {len(found)} replica(s))"

    return under_streams(ctx, "replica_kill", fault, after=ctx.settings.after)


def _engine_fault(ctx: Context, scenario: str, kind: str) -> FaultReport:
    def fault() -> str:
        done = ctx.admin.call("POST", "/faults", {"model": ctx.model, "kind": kind})
        return f"POST /admin/faults {kind}: {done.get('done')}"

    return under_streams(ctx, scenario, fault)


def engine_loop_kill(ctx: Context) -> FaultReport:
    return _engine_fault(ctx, "engine_loop_kill", "kill_engine_loop")


def engine_loop_hang(ctx: Context) -> FaultReport:
    return _engine_fault(ctx, "engine_loop_hang", "hang_engine_loop")
