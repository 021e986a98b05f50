"""What every scenario gets (`Context`: the server's URL, admin client, traffic, process scope,
the suite's own `up` if any, `SuiteSettings`) and the pieces they share: the strict expectation
(`no_broken`), a report from results (`build_report`), when the first error came (`first_error`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from specserve.platform.api.client import AdminClient
from specserve.tools.faults.outcome import RequestResult
from specserve.tools.faults.procs import Scope
from specserve.tools.faults.report import Counts, FaultReport, error_codes
from specserve.tools.faults.server import UpProcess
from specserve.tools.faults.traffic import Traffic


class SuiteSettings(BaseModel):
    """The bounds of every scenario: streams in flight at a fault, requests just after it,
    background load (workers = `streams`, at most `load_limit` requests, `window_s` after the
    fault), how long recovery may take, and the overload factor over `capacity`."""

    streams: int = Field(8, ge=1)
    after: int = Field(4, ge=0)
    load_limit: int = Field(200, ge=1)
    warmup_s: float = Field(1.0, ge=0)
    window_s: float = Field(8.0, gt=0)
    recover_limit_s: float = Field(120.0, gt=0)
    capacity: int | None = Field(None, ge=1)  # None: from the config
    overload_factor: float = Field(3.0, gt=1)
    adapter: Path | None = None  # version_bump: a LoRA adapter directory for the base model
    adapter_root: Path | None = None  # where the server accepts adapters from
    variant: str = "faults-bump"
    stop_limit_s: float = Field(120.0, gt=0)  # graceful_stop: how long `up` may take to exit


@dataclass
class Context:
    """A running server and how to reach its parts (a plain holder of live objects)."""

    url: str
    model: str
    admin: AdminClient
    traffic: Traffic
    scope: Scope
    settings: SuiteSettings
    config: Path | None = None  # the Serve config it runs (capacity, adapter root)
    up: UpProcess | None = None  # the suite's own `up`; None for --url

    @property
    def cache_dir(self) -> Path | None:
        return self.scope.cache_dir


def no_broken(counts: Counts) -> bool:
    """The expectation common to all: every request ended with a terminal event in time."""
    return counts.lost == counts.hung == counts.malformed == 0


def first_error(results: list[RequestResult], since: float) -> float | None:
    """Seconds from `since` to the first request that ended other than completed after it."""
    ends = [r.ended for r in results if r.outcome != "completed" and r.ended >= since]
    return round(min(ends) - since, 3) if ends else None


def build_report(
    scenario: str,
    results: list[RequestResult],
    probes: list[RequestResult],
    started: float,
    **fields,
) -> FaultReport:
    """A report of `results` (and recovery `probes`) for a scenario begun at `started`."""
    return FaultReport(
        scenario=scenario,
        counts=Counts.of(results),
        probes=Counts.of(probes),
        error_codes=error_codes(results),
        seconds=round(time.monotonic() - started, 3),
        **fields,
    )
