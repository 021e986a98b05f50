"""What the demo watches on a running cluster: ModelServer replicas (Serve's status), live worker
nodes (the GCS), which node each replica runs on, and a `Timeline` sampled once a second with the
traffic's in-flight requests, completions, errors and latency percentiles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ray
from pydantic import BaseModel
from ray import serve

from specserve.tools.cluster.app import SERVER
from specserve.tools.faults.outcome import RequestResult

APP = "specserve"


def running_replicas() -> int:
    """ModelServer replicas Serve reports RUNNING (0 when it cannot say)."""
    try:
        app = serve.status().applications[APP]
        states = app.deployments[SERVER].replica_states
    except (KeyError, AttributeError):
        return 0
    return int(sum(n for state, n in states.items() if str(state).endswith("RUNNING")))


def _actors() -> list[dict]:
    """The GCS's actor table, read directly. Private Ray API on purpose: the public
    `ray.util.state.list_actors` asks the dashboard's state API, and the demo's head runs with
    --include-dashboard=false (as the RayService head can)."""
    return list(ray._private.state.actors().values())


def replica_nodes() -> dict[str, str]:
    """Live ModelServer replicas (their id, as responses name them) -> node id, from the GCS's
    actor table (no dashboard needed)."""
    out = {}
    for actor in _actors():
        name = actor.get("Name") or ""
        if actor.get("State") == "ALIVE" and f"#{SERVER}#" in name:
            out[name.rsplit("#", 1)[1]] = actor["Address"]["NodeID"]
    return out


def gateway_nodes() -> set[str]:
    """Nodes that hold a live Gateway replica."""
    return {
        actor["Address"]["NodeID"]
        for actor in _actors()
        if actor.get("State") == "ALIVE" and "#Gateway#" in (actor.get("Name") or "")
    }


class Sample(BaseModel):
    """One second of the run: `t` seconds from the start, the phase, replicas and worker nodes,
    requests in flight, ended in this second (completed, errors) and their latency."""

    t: float
    phase: str
    replicas: int
    nodes: int
    in_flight: int
    completed: int
    errors: int
    p50_s: float | None = None
    p99_s: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))], 3)


class Timeline:
    """A thread sampling every `period_s` from `start()` to `stop()`. `results()` gives the
    requests ended so far (all traffic), `in_flight()` those not ended, `nodes()` live workers."""

    def __init__(
        self,
        results: Callable[[], list[RequestResult]],
        in_flight: Callable[[], int],
        nodes: Callable[[], int],
        period_s: float = 1.0,
    ) -> None:
        self.results, self.in_flight, self.nodes = results, in_flight, nodes
        self.period_s = period_s
        self.t0 = time.monotonic()
        self.phase = "start"
        self.samples: list[Sample] = []
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)

    def start(self) -> Timeline:
        self._thread.start()
        return self

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(10)
        return list(self.samples)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.samples.append(self.sample())
            except Exception as err:  # noqa: BLE001 - a GCS outage must not end the timeline
                self.samples.append(
                    Sample(
                        t=self.now(),
                        phase=f"{self.phase} ({type(err).__name__})",
                        replicas=-1,
                        nodes=-1,
                        in_flight=self.in_flight(),
                        completed=0,
                        errors=0,
                    )
                )

    def sample(self) -> Sample:
        ended = self.results()
        fresh, self._seen = ended[self._seen :], len(ended)
        done = [r for r in fresh if r.outcome == "completed"]
        latencies = [r.ended - r.started for r in done]
        return Sample(
            t=self.now(),
            phase=self.phase,
            replicas=running_replicas(),
            nodes=self.nodes(),
            in_flight=self.in_flight(),
            completed=len(done),
            errors=len(fresh) - len(done),
            p50_s=percentile(latencies, 0.5),
            p99_s=percentile(latencies, 0.99),
        )
