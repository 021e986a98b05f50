"""The demo's scenarios over one running cluster, in the order `runner` calls them: load ramps up
(replicas and a node added), a variant's pool and version across nodes, a worker node killed under
load, load stops (replica and node removed), the GCS restarted. Each returns its figures."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specserve.platform.api.http_client import ChatRequest
from specserve.tools.cluster import observe
from specserve.tools.cluster.app import MODEL, make_adapter, prompt
from specserve.tools.cluster.figures import KillFigures, PoolFigures, ScaleFigures
from specserve.tools.cluster.local import LocalCluster, wait_for
from specserve.tools.cluster.traffic import Answer, Recorder, admin, ask
from specserve.tools.faults.report import Counts, error_codes
from specserve.tools.faults.traffic import Load


class Bounds(BaseModel):
    """How much traffic and how long to wait: every wait of a scenario is bounded."""

    model_config = ConfigDict(frozen=True)

    clients: int = Field(40, ge=1, description="streaming clients of the load")
    max_tokens: int = Field(48, ge=1, description="tokens each load request streams")
    request_deadline_s: float = Field(90.0, gt=0, description="past it a request is hung")
    limit: int = Field(20000, ge=1, description="most load requests in all")
    wait_s: float = Field(150.0, gt=0, description="longest wait for one transition")
    burst: int = Field(8, ge=2, description="concurrent requests of a variant's first burst")
    pool_tokens: int = Field(16, ge=1, description="tokens of the pool scenario's answers")


class Run:
    """What the scenarios share: the cluster, the platform's URL and token, the traffic and the
    timeline, where files go."""

    def __init__(
        self,
        cluster: LocalCluster,
        url: str,
        token: str,
        model_dir: Path,
        adapter_root: Path,
        bounds: Bounds,
        timeline: observe.Timeline,
        recorder: Recorder,
    ) -> None:
        self.cluster, self.url, self.token = cluster, url, token
        self.model_dir, self.adapter_root, self.bounds = model_dir, adapter_root, bounds
        self.timeline, self.recorder = timeline, recorder

    def workers(self) -> int:
        return sum(not n.head for n in self.cluster.nodes())

    def spec(self, i: int) -> ChatRequest:
        return ChatRequest(
            url=self.url,
            model=MODEL,
            prompt=prompt(i % 16),
            max_tokens=self.bounds.max_tokens,
            deadline_s=self.bounds.request_deadline_s,
            ignore_eos=True,
        )

    def since(self, t: float, check) -> float | None:
        """Seconds from timeline time `t` until `check()` holds (None: not within the bound)."""
        return (
            None
            if wait_for(check, self.bounds.wait_s) is None
            else round(self.timeline.now() - t, 2)
        )

    def load(self, clients: int | None = None) -> Load:
        return Load(
            lambda i: self.recorder.send(self.spec(i)),
            clients or self.bounds.clients,
            self.bounds.limit,
        )


def ramp_up(run: Run) -> tuple[Load, ScaleFigures]:
    """Start the load; wait until Serve runs two ModelServer replicas and the autoscaler has
    added a worker node for the second."""
    figures = ScaleFigures(
        clients=run.bounds.clients, replicas=[observe.running_replicas()], nodes=[run.workers()]
    )
    run.timeline.phase = "load"
    load, t = run.load().start(), run.timeline.now()
    figures.node_added_s = run.since(t, lambda: run.workers() > figures.nodes[0])
    figures.replicas_up_s = run.since(t, lambda: observe.running_replicas() >= 2)
    figures.replicas.append(observe.running_replicas())
    figures.nodes.append(run.workers())
    return load, figures


def ramp_down(run: Run, load: Load, figures: ScaleFigures, min_workers: int) -> ScaleFigures:
    """Stop the load; wait for Serve to go back to one replica and the autoscaler to remove the
    idle node; the load's figures."""
    results = load.stop()
    run.timeline.phase = "idle"
    t = run.timeline.now()
    figures.replicas_down_s = run.since(t, lambda: observe.running_replicas() == 1)
    figures.node_removed_s = run.since(t, lambda: run.workers() == min_workers)
    figures.replicas.append(observe.running_replicas())
    figures.nodes.append(run.workers())
    figures.counts, figures.error_codes = Counts.of(results), error_codes(results)
    latencies = [r.ended - r.started for r in results if r.outcome == "completed"]
    figures.p50_s = observe.percentile(latencies, 0.5)
    figures.p99_s = observe.percentile(latencies, 0.99)
    return figures


def _register(run: Run, name: str, seed: int) -> int:
    adapter = make_adapter(run.model_dir, run.adapter_root / f"{name}-{seed}", seed)
    spec = {"name": name, "base_model": MODEL, "adapter_path": str(adapter)}
    return int(admin(run.url, run.token, "/admin/variants", spec)["version"])


def _burst(run: Run, name: str, count: int, seed: int) -> list[Answer]:
    """`count` requests of a variant at once: with no replica holding it yet, Serve spreads
    them over the replicas."""
    with ThreadPoolExecutor(count) as pool:
        jobs = [pool.submit(ask, run.url, name, prompt(seed + i), 8) for i in range(count)]
        return [job.result() for job in jobs]


def pool_across_nodes(run: Run, name: str = "shared", tries: int = 3) -> PoolFigures:
    """A variant on both nodes; its pool learned on one node is drafted from on the other."""
    figures = PoolFigures(variant=name)
    run.timeline.phase = "pool"
    nodes = observe.replica_nodes()
    for attempt in range(tries):  # Serve may put a whole burst on one replica: a fresh variant
        figures.variant = f"{name}-{attempt}"
        _register(run, figures.variant, seed=1)
        burst = _burst(run, figures.variant, run.bounds.burst, seed=100)
        if len({nodes.get(a.replica) for a in burst} - {None}) >= 2:
            break
        figures.notes.append(f"{figures.variant}: its first burst reached one node")
    text = prompt(7, words=10)
    cold = ask(run.url, figures.variant, text, run.bounds.pool_tokens)
    figures.learned_on_node = nodes.get(cold.replica)
    time.sleep(5.0)  # two pool-sync rounds (PoolSyncSettings.interval_s): pushed, then pulled
    cross = _elsewhere(run, figures.variant, text, figures.learned_on_node, nodes)
    if cross is not None:
        figures.used_on_node = nodes.get(cross.replica)
        figures.cross_node_tau, figures.cross_node_accepted = cross.tau, cross.accepted
        figures.pool_hits_across_nodes = cross.accepted - cold.accepted
        if cross.text != cold.text:
            figures.notes.append("the two answers differ: not the same greedy output")
    figures.cold_tau, figures.cold_accepted = cold.tau, cold.accepted
    for _ in range(tries):  # each version is a new multiplexed id, spread afresh
        _bump(run, figures.variant, figures, nodes)
        if figures.nodes_serving_bump >= 2:
            break
    return figures


def _elsewhere(run: Run, name: str, text: str, node: str | None, nodes: dict) -> Answer | None:
    """The first answer of `text` served on a node other than `node` (bounded tries)."""
    for _ in range(12):
        answer = ask(run.url, name, text, run.bounds.pool_tokens)
        if nodes.get(answer.replica) not in (None, node):
            return answer
    return None


def _bump(run: Run, name: str, figures: PoolFigures, nodes: dict) -> None:
    figures.bump_version = _register(run, name, seed=2)
    answers = _burst(run, name, run.bounds.burst, seed=200)
    figures.nodes_serving_bump = len({nodes.get(a.replica) for a in answers} - {None})
    figures.bump_answers_on_new_version = all(a.version == figures.bump_version for a in answers)


def kill_node(run: Run) -> KillFigures:
    """SIGKILL every process of a worker node that runs a ModelServer replica and no Gateway,
    under the running load; how the requests in flight then end, and the recovery."""
    figures = KillFigures()
    replicas, gateways = observe.replica_nodes(), observe.gateway_nodes()
    targets = [n for n in set(replicas.values()) if n not in gateways]
    if not targets:
        figures.notes.append("no worker node with a replica and no gateway: nothing killed")
        return figures
    figures.node = targets[0]
    figures.replicas_on_node = sum(n == figures.node for n in replicas.values())
    before, workers = run.recorder.in_flight(), run.workers()
    run.timeline.phase = "node killed"
    t_kill, mono_kill = run.timeline.now(), time.monotonic()
    figures.processes_killed = run.cluster.kill_node(figures.node)
    figures.in_flight_at_kill = before
    _recovery(run, figures, t_kill, mono_kill, workers)
    return figures


def _recovery(
    run: Run, figures: KillFigures, t_kill: float, mono_kill: float, workers: int
) -> None:
    def served_again() -> bool:
        return any(
            r.outcome == "completed" and r.started > mono_kill for r in run.recorder.results()
        )

    figures.serves_again_s = run.since(t_kill, served_again)
    figures.replicas_back_s = run.since(t_kill, lambda: observe.running_replicas() >= 2)
    figures.node_replaced_s = run.since(t_kill, lambda: run.workers() >= workers)
    # every request in flight at the kill ends by its deadline (past it: hung)
    wait_for(
        lambda: (run.recorder.oldest_in_flight() or mono_kill) >= mono_kill,
        run.bounds.request_deadline_s + 10,
    )
    crossing = [r for r in run.recorder.results() if r.started < mono_kill < r.ended]
    figures.in_flight_outcomes = Counts.of(crossing)
    figures.error_codes = error_codes(crossing)
    figures.lost, figures.hung = figures.in_flight_outcomes.lost, figures.in_flight_outcomes.hung
