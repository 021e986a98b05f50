"""Draining a gateway: after `begin`, new model requests answer 503 shutting_down + Retry-After,
admitted streams finish within the timeout, and one still running at the deadline ends with an
SSE error event then [DONE] (a whole-body reply: a 503 body); `/healthz` answers 503 draining."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from done_event import done_event
from fastapi.testclient import TestClient

from specserve.platform.api.drain import Drain, ShuttingDown
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.events import Delta
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry

BASE = "tiny"


class PacedBackend:
    """A model server that streams `tokens` deltas `gap_s` apart, then Done; counts closes."""

    def __init__(self, tokens: int, gap_s: float) -> None:
        self.tokens, self.gap_s = tokens, gap_s
        self.closed = 0

    async def _events(self):
        try:
            for i in range(self.tokens):
                yield Delta(text=f"t{i} ", token_ids=[i])
                await asyncio.sleep(self.gap_s)
            yield done_event(self.tokens)
        finally:
            self.closed += 1

    def stream(self, base_model, request):
        return self._events()

    async def replica_stats(self) -> dict:
        return {}


def _gateway(backend) -> tuple[Gateway, TestClient]:
    gateway = Gateway(PlatformSettings(models=[BASE]), Registry(MemoryStore()), backend, Metrics())
    return gateway, TestClient(create_app(gateway))


def _body(stream: bool) -> dict:
    return {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def _stream_in_thread(client: TestClient, out: list, started: threading.Event):
    def run():
        with client.stream("POST", "/v1/chat/completions", json=_body(True)) as response:
            parts = []
            for line in response.iter_lines():
                if line:
                    parts.append(line)
                    started.set()
            out.append((response.status_code, parts))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _payloads(parts: list[str]) -> list:
    return [p.removeprefix("data: ") for p in parts]


def test_in_flight_streams_finish_and_new_requests_get_503():
    backend = PacedBackend(tokens=12, gap_s=0.05)
    gateway, client = _gateway(backend)
    out, started = [], threading.Event()
    thread = _stream_in_thread(client, out, started)
    assert started.wait(10)
    gateway.drain.begin(30.0)
    for stream in (False, True):
        refused = client.post("/v1/chat/completions", json=_body(stream))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["code"] == "shutting_down"
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["status"] == "draining"
    thread.join(20)
    ((status, parts),) = out
    payloads = _payloads(parts)
    assert status == 200 and payloads[-1] == "[DONE]"
    final = json.loads(payloads[-2])
    assert final["choices"][0]["finish_reason"] == "length"  # the whole answer, not cut
    assert sum("t11 " in p for p in payloads) == 1
    assert gateway.inflight_total() == 0


def test_a_request_still_resolving_counts_as_in_flight_for_the_drain():
    """Admitted before the drain, but its registry lookup is slow: the drain must wait for it
    (a count that began only once it was resolved let the platform stop under it)."""
    gateway, client = _gateway(PacedBackend(tokens=3, gap_s=0.01))
    resolving, release = threading.Event(), threading.Event()
    resolve = gateway.resolve

    def slow_resolve(model, token):
        resolving.set()
        assert release.wait(10)
        return resolve(model, token)

    gateway.resolve = slow_resolve
    out = []
    thread = threading.Thread(
        target=lambda: out.append(client.post("/v1/chat/completions", json=_body(False)))
    )
    thread.start()
    assert resolving.wait(10)
    assert gateway.inflight_total() == 1
    gateway.drain.begin(30.0)
    release.set()
    thread.join(20)
    assert out[0].status_code == 200, out[0].text  # admitted before the drain: answered whole
    assert gateway.inflight_total() == 0


def test_a_stream_still_running_at_the_deadline_ends_with_an_error_event():
    backend = PacedBackend(tokens=1000, gap_s=0.05)
    gateway, client = _gateway(backend)
    out, started = [], threading.Event()
    thread = _stream_in_thread(client, out, started)
    assert started.wait(10)
    began = time.monotonic()
    gateway.drain.begin(0.5)
    thread.join(20)
    assert time.monotonic() - began < 3.0
    ((status, parts),) = out
    payloads = _payloads(parts)
    assert status == 200 and payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "shutting_down" and error["type"] == "server_error"
    assert backend.closed == 1 and gateway.inflight_total() == 0  # the decode was stopped


def test_a_whole_body_reply_cut_at_the_deadline_is_a_503():
    gateway, client = _gateway(PacedBackend(tokens=1000, gap_s=0.05))
    timer = threading.Timer(0.3, gateway.drain.begin, args=(0.3,))
    timer.start()
    response = client.post("/v1/chat/completions", json=_body(False))
    assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
    assert response.headers["retry-after"] == "2"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_second_begin_may_shorten_the_deadline_never_extend_it():
    clock = _Clock()
    drain = Drain(clock)
    assert not drain.draining and drain.remaining_s() is None
    drain.admit()
    drain.begin(30)
    drain.begin(60)
    assert drain.remaining_s() == 30
    drain.begin(5)
    assert drain.remaining_s() == 5
    clock.now += 10
    assert drain.remaining_s() == 0.0


def test_bounded_passes_every_event_and_closes_a_stuck_source():
    async def source(n, stuck):
        for i in range(n):
            yield i
        if stuck:
            await asyncio.Event().wait()  # a replica that never answers again

    async def run():
        drain = Drain()
        assert [e async for e in drain.bounded(source(5, stuck=False))] == list(range(5))
        got, began = [], time.monotonic()
        with pytest.raises(ShuttingDown):
            async for event in drain.bounded(source(3, stuck=True)):
                got.append(event)
                if event == 2:
                    drain.begin(0.2)
        return got, time.monotonic() - began

    got, took = asyncio.run(run())
    assert got == [0, 1, 2] and 0.15 < took < 1.5
