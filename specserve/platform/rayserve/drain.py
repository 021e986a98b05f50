"""The platform's drain under Ray: one named actor (`DrainSignal`) that `specserve up` (on SIGTERM or
SIGINT) or `specserve drain` (a k8s preStop hook) tells to begin; every Gateway replica polls it,
begins its own `Drain` and reports what it still holds, and `drain_platform` waits until they
hold nothing or the timeout has passed (streams still running then end with an error event)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import ray
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)
SIGNAL_NAME, SIGNAL_NAMESPACE = "specserve-drain", "specserve"
POLL_S = 0.25  # how soon a gateway sees a drain begin
# A gateway silent this long is gone (not waited for). Far above POLL_S: on a loaded machine a
# live gateway's report can lag seconds, and a drain that forgot it would cut its streams.
REPORT_GONE_S = 15.0
CUT_GRACE_S = 2.0  # after the deadline: time for the cut streams' error events to go out
PROXY_FLUSH_S = 0.5  # once the gateways are empty: Serve's proxy writes their last bytes out


class DrainState(BaseModel):
    """What a gateway reads: whether to drain and how long admitted requests have left."""

    model_config = ConfigDict(frozen=True)

    draining: bool
    remaining_s: float | None = None


class DrainStatus(DrainState):
    """What the stopping side reads: requests the live gateways hold, and how many of them
    reported while already draining (admitting nothing, so their count can only fall)."""

    inflight: int = 0
    gateways: int = 0
    draining_gateways: int = 0


class GatewayReport(BaseModel):
    """One gateway's poll. `seq` rises with each poll (a late, stale one is ignored); `draining`:
    `inflight` was counted after the gateway stopped admitting, so 0 then means done for good,
    however long the report took to arrive."""

    model_config = ConfigDict(frozen=True)

    gateway: str
    node: str
    inflight: int
    seq: int
    draining: bool


class DrainOutcome(BaseModel):
    """How a drain went: seconds waited, requests held when it began, and those still running at
    the end (cut with an error event)."""

    waited_s: float
    inflight_at_begin: int
    inflight_at_end: int


EVERY_NODE = "*"


@ray.remote(num_cpus=0)
class DrainSignal:
    """Drains by scope (a node id, or EVERY_NODE) and the gateways' last reports (replica id ->
    time, node, in flight). A node's drain never outlives the node's gateways' interest: only
    gateways on that node (or every gateway, for EVERY_NODE) see it."""

    def __init__(self) -> None:
        self.deadlines: dict[str, float] = {}  # scope -> when its admitted requests are cut
        self.reports: dict[str, tuple[float, GatewayReport]] = {}  # gateway -> (received, report)

    def begin(self, timeout_s: float, scope: str = EVERY_NODE) -> DrainState:
        now = time.time()
        self.deadlines[scope] = min(self.deadlines.get(scope, now + timeout_s), now + timeout_s)
        return self._state(scope, now)

    def poll(self, report: GatewayReport) -> DrainState:
        now = time.time()
        last = self.reports.get(report.gateway)
        if last is None or report.seq > last[1].seq:
            self.reports[report.gateway] = (now, report)
        return self._state(report.node, now)

    def leave(self, gateway: str) -> None:
        """A gateway that stops (Serve replaced or stopped it) is no longer waited for."""
        self.reports.pop(gateway, None)

    def status(self, scope: str = EVERY_NODE) -> DrainStatus:
        now = time.time()
        live = [
            report
            for at, report in self.reports.values()
            if now - at < REPORT_GONE_S and scope in (EVERY_NODE, report.node)
        ]
        return DrainStatus(
            **self._state(scope, now).model_dump(),
            inflight=sum(r.inflight for r in live),
            gateways=len(live),
            draining_gateways=sum(1 for r in live if r.draining),
        )

    def _state(self, node: str, now: float) -> DrainState:
        deadlines = [self.deadlines[s] for s in (node, EVERY_NODE) if s in self.deadlines]
        if not deadlines:
            return DrainState(draining=False)
        return DrainState(draining=True, remaining_s=max(0.0, min(deadlines) - now))


def drain_signal():
    """The cluster's one DrainSignal (created by whoever asks first; lives as long as Ray)."""
    return DrainSignal.options(
        name=SIGNAL_NAME, namespace=SIGNAL_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


class GatewayDrainWatch:
    """A gateway replica's thread: reports `inflight()` every POLL_S and, once the signal says
    so, begins `begin(remaining_s)` (the gateway's Drain)."""

    def __init__(
        self,
        gateway: str,
        node: str,
        inflight: Callable[[], int],
        begin: Callable[[float], None],
    ) -> None:
        self.gateway, self.node, self.inflight, self.begin = gateway, node, inflight, begin
        self.draining = False  # set once `begin` was called: counts from then on can only fall
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drain-watch", daemon=True)

    def start(self) -> GatewayDrainWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and leave the signal's reports (best effort: Ray may be going down)."""
        self._stop.set()
        try:
            drain_signal().leave.remote(self.gateway)
        except Exception as err:  # noqa: BLE001 - a stale report ages out after REPORT_GONE_S
            log.debug("could not leave the drain signal: %s", err)

    def report(self, seq: int) -> GatewayReport:
        """What this gateway holds now; `draining` is read first, so it never overstates."""
        draining = self.draining
        return GatewayReport(
            gateway=self.gateway,
            node=self.node,
            inflight=self.inflight(),
            seq=seq,
            draining=draining,
        )

    def _run(self) -> None:
        signal, seq = None, 0
        while not self._stop.wait(POLL_S):
            seq += 1
            try:
                signal = signal or drain_signal()
                state = ray.get(signal.poll.remote(self.report(seq)), timeout=5)
            except Exception as err:  # noqa: BLE001 - the signal restarts with Ray; try again
                log.warning("drain signal unreachable: %s", err)
                signal = None
                continue
            if state.draining:
                self.begin(state.remaining_s)
                self.draining = True


def drain_platform(
    timeout_s: float,
    log_line=log.info,
    scope: str = EVERY_NODE,
    clock=time.monotonic,
    give_up: threading.Event | None = None,
) -> DrainOutcome:
    """Begin the drain and wait until every gateway in `scope` (a node id: that node's gateways)
    has reported, while draining, that it holds no request (then PROXY_FLUSH_S more for the
    proxy's last bytes), or `timeout_s` plus a grace for the cut streams' error events has
    passed, or `give_up` is set (a second Ctrl-C)."""
    signal = drain_signal()
    began = clock()
    ray.get(signal.begin.remote(timeout_s, scope), timeout=10)
    first = ray.get(signal.status.remote(scope), timeout=10)
    at_begin = first.inflight
    log_line(
        f"draining: {at_begin} request(s) in flight on {first.gateways} gateway(s),"
        f" up to {timeout_s:g} s to finish"
    )
    status = None
    while clock() - began < timeout_s + CUT_GRACE_S and not (give_up and give_up.is_set()):
        status = ray.get(signal.status.remote(scope), timeout=10)
        if status.inflight == 0 and status.draining_gateways == status.gateways:
            time.sleep(PROXY_FLUSH_S)
            break
        time.sleep(POLL_S)
    at_end = status.inflight if status is not None else at_begin
    outcome = DrainOutcome(
        waited_s=round(clock() - began, 2), inflight_at_begin=at_begin, inflight_at_end=at_end
    )
    log_line(
        f"drained in {outcome.waited_s} s"
        + (f"; {at_end} request(s) cut with an error event" if at_end else "")
    )
    return outcome
