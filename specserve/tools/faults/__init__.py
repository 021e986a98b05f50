"""`specserve faults`: a bounded fault suite on loopback; each scenario breaks one part of a running
platform (replica, engine loop, redis, controller, registry, pool store, capacity, shutdown) under
streaming traffic and reports how every request ended, time to detect and to recover, as JSON.

Modules: `outcome` (one request, classified strictly), `report` (the models, text and Markdown
tables), `traffic` (streams, load, probes), `procs` (psutil finders), `server` (the suite's own
`specserve up`), `context` (what scenarios share), the scenarios (`stream_faults`, `load_faults`,
`store_faults`, `capacity_faults`) and `runner` (`run_suite`).
"""

from specserve.tools.faults.report import Counts, FaultReport, SuiteReport, markdown, table
from specserve.tools.faults.runner import SCENARIOS, RunSettings, run_suite

__all__ = [
    "SCENARIOS",
    "Counts",
    "FaultReport",
    "RunSettings",
    "SuiteReport",
    "markdown",
    "run_suite",
    "table",
]
