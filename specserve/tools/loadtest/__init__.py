"""`specserve loadtest`: drive a running server with concurrent streaming chat requests spread over
variants, per concurrency level and mode (`ar` forced, `spec` = lookahead forced, `policy`), and
report throughput, TTFT and inter-token latency percentiles, τ and failures as JSON.

The scenarios, one module each: `levels` (the load levels), `overload` (more clients than
capacity, then the drain), `disconnect` (streams cut after a few tokens), `chart` (a PNG of the
levels); `probes` read the server's own figures, `client` is the HTTP side. The names the CLI
and the scripts use are here.
"""

from specserve.tools.loadtest.chart import plot
from specserve.tools.loadtest.client import Traffic, fetch
from specserve.tools.loadtest.disconnect import run_disconnect
from specserve.tools.loadtest.levels import (
    MODES,
    interleave_tasks,
    level_requests,
    run_level,
    summarize,
)
from specserve.tools.loadtest.overload import run_overload
from specserve.tools.loadtest.probes import engine_figures, engine_share

__all__ = [
    "MODES",
    "Traffic",
    "engine_figures",
    "engine_share",
    "fetch",
    "interleave_tasks",
    "level_requests",
    "plot",
    "run_disconnect",
    "run_level",
    "run_overload",
    "summarize",
]
