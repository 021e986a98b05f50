"""The drain signal on a real local Ray: gateways in the drained scope (every node, or one node)
begin their drain and report what they hold; `drain_platform` waits until they hold nothing,
or gives up at the timeout plus the grace; the application builder gives every replica as
long as a drain for Serve's graceful stop."""

from __future__ import annotations

import threading
import time

import pytest

from specserve.platform.rayserve import drain as drain_mod
from specserve.platform.rayserve.drain import (
    EVERY_NODE,
    GatewayDrainWatch,
    GatewayReport,
    drain_platform,
    drain_signal,
)


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="test-drain")
    yield ray
    ray.shutdown()


class Held:
    """A gateway's in-flight count that the test changes; and the drains it was told to begin."""

    def __init__(self, n: int) -> None:
        self.n, self.begun = n, []

    def inflight(self) -> int:
        return self.n

    def begin(self, remaining_s: float) -> None:
        self.begun.append(remaining_s)


def _watch(name: str, node: str, held: Held) -> GatewayDrainWatch:
    return GatewayDrainWatch(name, node, held.inflight, held.begin).start()


def test_a_node_drain_reaches_that_nodes_gateways_and_waits_for_them(local_ray):
    on_node, elsewhere = Held(2), Held(5)
    watches = [_watch("g1", "node-a", on_node), _watch("g2", "node-b", elsewhere)]
    try:
        time.sleep(1.0)  # both have reported
        threading.Timer(1.5, lambda: setattr(on_node, "n", 0)).start()  # its streams finish
        lines = []
        began = time.monotonic()
        outcome = drain_platform(20.0, lines.append, scope="node-a")
        assert 1.2 < time.monotonic() - began < 8.0  # not the 20 s timeout
        assert outcome.inflight_at_begin == 2 and outcome.inflight_at_end == 0
        assert on_node.begun and 0 < on_node.begun[0] <= 20.0
        assert elsewhere.begun == []  # another node's gateway keeps admitting
        assert lines[0].startswith("draining: 2 request(s) in flight on 1 gateway(s)")
    finally:
        for watch in watches:
            watch.stop()


def test_a_drain_that_cannot_finish_gives_up_after_timeout_and_grace(local_ray, monkeypatch):
    monkeypatch.setattr(drain_mod, "CUT_GRACE_S", 0.5)
    stuck = Held(3)
    watch = _watch("g3", "node-c", stuck)
    try:
        time.sleep(1.0)
        began = time.monotonic()
        outcome = drain_platform(1.0, lambda line: None, scope="node-c")
        assert 1.4 < time.monotonic() - began < 4.0
        assert outcome.inflight_at_end == 3
        give_up = threading.Event()
        threading.Timer(0.5, give_up.set).start()  # a second Ctrl-C
        began = time.monotonic()
        drain_platform(30.0, lambda line: None, scope="node-c", give_up=give_up)
        assert time.monotonic() - began < 3.0
    finally:
        watch.stop()


def _report(gateway: str, node: str, inflight: int, seq: int, draining: bool):
    return GatewayReport(gateway=gateway, node=node, inflight=inflight, seq=seq, draining=draining)


def test_only_a_count_taken_while_draining_ends_the_drain(local_ray, monkeypatch):
    """On a loaded machine a gateway's poll can reach the signal seconds after it was counted:
    a 0 counted before the gateway stopped admitting, delivered after the drain began, once
    ended the drain under three running streams. Silence is not an end either, until the
    gateway leaves; a late report older than one already held is ignored."""
    import ray

    monkeypatch.setattr(drain_mod, "CUT_GRACE_S", 0.2)
    signal = drain_signal()
    ray.get(signal.poll.remote(_report("g5", "node-e", 2, seq=1, draining=False)))
    late = _report("g5", "node-e", 0, seq=2, draining=False)  # counted before the drain
    threading.Timer(0.5, lambda: ray.get(signal.poll.remote(late))).start()
    began = time.monotonic()
    outcome = drain_platform(3.0, lambda line: None, scope="node-e")
    assert time.monotonic() - began >= 3.0  # waited to the timeout: nothing said "done"
    assert outcome.inflight_at_begin == 2
    ray.get(signal.poll.remote(_report("g5", "node-e", 0, seq=4, draining=True)))
    ray.get(signal.poll.remote(_report("g5", "node-e", 5, seq=3, draining=False)))  # stale
    began = time.monotonic()
    assert drain_platform(30.0, lambda line: None, scope="node-e").inflight_at_end == 0
    assert time.monotonic() - began < 3.0
    ray.get(signal.poll.remote(_report("g6", "node-f", 1, seq=1, draining=True)))
    ray.get(signal.leave.remote("g6"))  # Serve stopped it: nothing left to wait for
    began = time.monotonic()
    assert drain_platform(30.0, lambda line: None, scope="node-f").inflight_at_end == 0
    assert time.monotonic() - began < 3.0


def test_every_node_drain_reaches_every_gateway_and_keeps_the_earliest_deadline(local_ray):
    import ray

    held = Held(0)
    watch = _watch("g4", "node-d", held)
    try:
        signal = drain_signal()
        first = ray.get(signal.begin.remote(10.0, EVERY_NODE))
        later = ray.get(signal.begin.remote(60.0, EVERY_NODE))
        assert first.draining and later.remaining_s <= first.remaining_s <= 10.0
        deadline = time.monotonic() + 5
        while not held.begun and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.begun and held.begun[0] <= 10.0
    finally:
        watch.stop()


def test_build_app_gives_replicas_the_drain_timeout_for_a_graceful_stop():
    from specserve.platform.rayserve.deployments import build_app

    args = {"models": ["tiny"], "shutdown_timeout_s": 12.0}
    app = build_app(args, [{"name": "Gateway", "graceful_shutdown_timeout_s": 5}])
    gateway = app._bound_deployment
    (server,) = [app._bound_deployment for app in gateway.init_args[1].values()]
    assert gateway._deployment_config.graceful_shutdown_timeout_s == 5  # the config's wins
    assert server._deployment_config.graceful_shutdown_timeout_s == 12.0
