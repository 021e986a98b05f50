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
REPORT_FRESH_S = 3.0  # a gateway that has not reported for this long is gone (not waited for)
CUT_GRACE_S = 2.0  # after the deadline: time for the cut streams' error events to go out


class DrainState(BaseModel):
    """What a gateway reads: whether to drain and how long admitted requests have left."""

    model_config = ConfigDict(frozen=True)

    draining: bool
    remaining_s: float | None = None


class DrainStatus(DrainState):
    """What the stopping side reads: requests the live gateways hold, and how many of them
    reported since the drain began (0: none has seen it yet)."""

    inflight: int = 0
    gateways: int = 0
    reported_since_begin: int = 0


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
        self.drains: dict[str, tuple[float, float]] = {}  # scope -> (began, deadline)
        self.reports: dict[str, tuple[float, str, int]] = {}

    def begin(self, timeout_s: float, scope: str = EVERY_NODE) -> DrainState:
        now = time.time()
        began, deadline = self.drains.get(scope, (now, now + timeout_s))
        self.drains[scope] = (began, min(deadline, now + timeout_s))
        return self._state(scope, now)

    def poll(self, gateway: str, node: str, inflight: int) -> DrainState:
        now = time.time()
        self.reports[gateway] = (now, node, inflight)
        return self._state(node, now)

    def status(self, scope: str = EVERY_NODE) -> DrainStatus:
        now = time.time()
        began = self.drains.get(scope, (None, None))[0]
        live = [
            (at, n)
            for at, node, n in self.reports.values()
            if now - at < REPORT_FRESH_S and scope in (EVERY_NODE, node)
        ]
        return DrainStatus(
            **self._state(scope, now).model_dump(),
            inflight=sum(n for _, n in live),
            gateways=len(live),
            reported_since_begin=sum(1 for at, _ in live if began is not None and at > began),
        )

    def _state(self, node: str, now: float) -> DrainState:
        deadlines = [self.drains[s][1] for s in (node, EVERY_NODE) if s in self.drains]
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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drain-watch", daemon=True)

    def start(self) -> GatewayDrainWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        signal = None
        while not self._stop.wait(POLL_S):
            try:
                signal = signal or drain_signal()
                state = ray.get(
                    signal.poll.remote(self.gateway, self.node, self.inflight()), timeout=5
                )
            except Exception as err:  # noqa: BLE001 - the signal restarts with Ray; try again
                log.warning("drain signal unreachable: %s", err)
                signal = None
                continue
            if state.draining:
                self.begin(state.remaining_s)


def drain_platform(
    timeout_s: float,
    log_line=log.info,
    scope: str = EVERY_NODE,
    clock=time.monotonic,
    give_up: threading.Event | None = None,
) -> DrainOutcome:
    """Begin the drain and wait until the gateways hold no request (each having reported since
    it began) in `scope` (a node id: that node's gateways), or `timeout_s` plus a grace for the cut streams' error events has passed, or
    `give_up` is set (a second Ctrl-C)."""
    signal = drain_signal()
    began = clock()
    ray.get(signal.begin.remote(timeout_s, scope), timeout=10)
    at_begin = ray.get(signal.status.remote(scope), timeout=10).inflight
    log_line(f"draining: {at_begin} request(s) in flight, up to {timeout_s:g} s to finish")
    status = None
    while clock() - began < timeout_s + CUT_GRACE_S and not (give_up and give_up.is_set()):
        status = ray.get(signal.status.remote(scope), timeout=10)
        if status.inflight == 0 and status.reported_since_begin == status.gateways:
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
