"""The head's GCS server killed and started again under light load: with its tables in Redis
(Ray's GCS fault tolerance, as the RayService's gcsFaultToleranceOptions set up) raylets, actors
and Serve's replicas outlive it; the figures say what the outage cost and what survived."""

from __future__ import annotations

import time

import ray

from specserve.platform.api.http_client import NETWORK_ERRORS, get_json
from specserve.tools.cluster import observe
from specserve.tools.cluster.figures import GcsFigures
from specserve.tools.cluster.local import wait_for
from specserve.tools.cluster.scenarios import Run
from specserve.tools.cluster.traffic import ask
from specserve.tools.faults.report import Counts


def _answers() -> bool:
    try:
        return bool(ray.nodes())
    except Exception:  # noqa: BLE001 - any failure means: not back yet
        return False


def restart_gcs(run: Run, outage_s: float) -> GcsFigures:
    """Kill the GCS, keep it down `outage_s` under 4 streaming clients, start it again; figures."""
    figures = GcsFigures(redis_backed=run.cluster.gcs_redis is not None)
    replicas_before = set(observe.replica_nodes())
    load = run.load(clients=4).start()
    time.sleep(2.0)
    run.timeline.phase = "gcs down"
    mono = time.monotonic()
    run.cluster.kill_gcs()
    time.sleep(outage_s)
    run.cluster.restart_gcs()
    t_back = run.timeline.now()
    figures.outage_s = round(time.monotonic() - mono, 2)
    back = wait_for(_answers, run.bounds.wait_s)
    figures.gcs_back_s = round(run.timeline.now() - t_back, 2) if back else None
    run.timeline.phase = "gcs back"
    figures.serves_after_s = run.since(t_back, lambda: _completed_since(run, time.monotonic()))
    results = load.stop()
    figures.outage_counts = Counts.of(r for r in results if r.started < mono + outage_s)
    if back:
        figures.same_replicas = set(observe.replica_nodes()) == replicas_before
        figures.nodes_after = run.workers()
    figures.variants_after = _models(run.url)
    return figures


def _models(url: str) -> int | None:
    """How many models /v1/models lists (base and variants: the registry answers)."""
    try:
        return len(get_json(f"{url}/v1/models", timeout=30)["data"])
    except (KeyError, TypeError):
        return None


def _completed_since(run: Run, since: float) -> bool:
    try:
        ask(run.url, "tiny", "w1 w2 w3", 4)
    except NETWORK_ERRORS:
        return False
    return time.monotonic() > since
