"""The demo's JSON summary as pydantic models: one model of figures per scenario (scale-out and
in, a variant's pool and registry across nodes, a node killed under load, the GCS restarted),
the settings it ran with, where it ran, and the timeline."""

from __future__ import annotations

from pydantic import BaseModel, Field

from specserve.tools.cluster.observe import Sample
from specserve.tools.faults.report import Counts


class ScaleFigures(BaseModel):
    """Load on, then off: replicas and worker nodes before, at the peak and after; seconds from
    the load's start (up) or stop (down) to each change; the load's requests and latency."""

    clients: int
    replicas: list[int]  # before, peak, after
    nodes: list[int]  # worker nodes: before, peak, after
    replicas_up_s: float | None = None
    node_added_s: float | None = None
    replicas_down_s: float | None = None
    node_removed_s: float | None = None
    counts: Counts = Counts()
    error_codes: dict[str, int] = Field(default_factory=dict)
    p50_s: float | None = None
    p99_s: float | None = None


class PoolFigures(BaseModel):
    """One variant served on two nodes: a prompt first answered on one (cold), then on a replica
    of another node, whose drafts come from the pool the first one shared through Redis. Then a
    version bump, answered on every node."""

    variant: str
    learned_on_node: str | None = None
    used_on_node: str | None = None
    cold_tau: float | None = None
    cross_node_tau: float | None = None
    cold_accepted: int | None = None  # draft tokens accepted: the prompt's first answer
    cross_node_accepted: int | None = None  # the same prompt, same output, on the other node
    pool_hits_across_nodes: int | None = None  # cross_node_accepted - cold_accepted
    bump_version: int | None = None
    nodes_serving_bump: int = 0
    bump_answers_on_new_version: bool = False
    notes: list[str] = Field(default_factory=list)


class KillFigures(BaseModel):
    """A worker node SIGKILLed (every process) under load: how the requests in flight then ended,
    and seconds from the kill until a request completes again and until capacity is back."""

    node: str | None = None
    processes_killed: int = 0
    replicas_on_node: int = 0
    in_flight_at_kill: int = 0
    in_flight_outcomes: Counts = Counts()
    error_codes: dict[str, int] = Field(default_factory=dict)
    lost: int = 0
    hung: int = 0
    serves_again_s: float | None = None
    replicas_back_s: float | None = None
    node_replaced_s: float | None = None
    notes: list[str] = Field(default_factory=list)


class GcsFigures(BaseModel):
    """The head's GCS server SIGKILLed and started again with its tables in Redis: requests during
    the outage, seconds until the cluster answers again, and what survived."""

    redis_backed: bool
    outage_s: float = 0.0
    outage_counts: Counts = Counts()
    gcs_back_s: float | None = None
    serves_after_s: float | None = None
    same_replicas: bool | None = None
    nodes_after: int | None = None
    variants_after: int | None = None
    notes: list[str] = Field(default_factory=list)


class Machine(BaseModel):
    cpu: str
    cores: int
    ray: str


class Summary(BaseModel):
    """A whole run: settings, machine, seconds, every scenario's figures, the timeline."""

    command: str
    machine: Machine
    settings: dict
    serve_autoscaling: dict  # the ModelServer's autoscaling_config as deployed
    cluster: dict  # the ClusterShape the fake provider ran (from the RayService)
    seconds: float = 0.0
    scale: ScaleFigures | None = None
    pool: PoolFigures | None = None
    kill: KillFigures | None = None
    gcs: GcsFigures | None = None
    errors: list[str] = Field(default_factory=list)  # a scenario that raised
    timeline: list[Sample] = Field(default_factory=list)

    def targets(self) -> dict[str, bool]:
        """The issue's bar, each as met or not."""
        s, p, k = self.scale, self.pool, self.kill
        return {
            "replicas 1 -> >=2 -> 1": bool(
                s and s.replicas[0] == 1 and s.replicas[1] >= 2 and s.replicas[2] == 1
            ),
            "node added and removed": bool(
                s and s.nodes[1] > s.nodes[0] and s.nodes[2] < s.nodes[1]
            ),
            "pool hits across nodes > 0": bool(p and (p.pool_hits_across_nodes or 0) > 0),
            "version bump on every node": bool(
                p and p.nodes_serving_bump >= 2 and p.bump_answers_on_new_version
            ),
            "node kill: 0 lost, 0 hung": bool(
                k and k.in_flight_at_kill > 0 and k.lost == 0 and k.hung == 0
            ),
            "serves again after the kill": bool(k and k.serves_again_s is not None),
        }
