"""A model server failing mid-reply: the stream ends with one OpenAI error event then [DONE]
(counted in metrics), the whole-body reply answers a 503 OpenAI error; neither leaks details."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.api.shaping import Reply, sse
from specserve.platform.events import Delta
from specserve.platform.service import ReplicaLost
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry

BASE = "tiny"
LEAKY = "worker pid=4242 at 10.0.0.7 in /home/ray/specserve/engine/batch/scheduler.py"
ERRORS = [(ReplicaLost(LEAKY), "replica_lost"), (RuntimeError(LEAKY), "stream_error")]


async def _failing_after(text: str, error: Exception):
    yield Delta(text=text, token_ids=[1])
    raise error


class DyingBackend:
    """Streams one delta, then fails as a replica that died (or a model-server error)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def stream(self, base_model, request):
        return _failing_after("hello ", self.error)

    async def replica_stats(self) -> dict:
        return {}


def _error_count(metrics: Metrics, status: str, code: str) -> float:
    """Errors counted with this status and code, over every endpoint label."""
    (family,) = [f for f in metrics.registry.collect() if f.name == "specserve_request_errors"]
    return sum(
        s.value
        for s in family.samples
        if s.name.endswith("_total") and s.labels["status"] == status and s.labels["code"] == code
    )


def _assert_clean_error(error: dict, code: str) -> None:
    assert error["code"] == code and error["type"] == "server_error"
    assert not any(s in error["message"] for s in ("pid", "10.0.0.7", "/", "Traceback"))


async def _sse_parts(error: Exception, metrics: Metrics, closed: list) -> list[str]:
    reply = Reply("chat", BASE, BASE, 0.0)
    first = Delta(text="hi", token_ids=[1])
    events = _failing_after("more", error)
    on_close = lambda: closed.append(1)
    body = sse(reply, first, events, False, None, on_close, metrics.observe_stream_error)
    return [part async for part in body]


@pytest.mark.parametrize(("error", "code"), ERRORS)
def test_a_stream_cut_mid_way_ends_with_an_error_event_then_done(error, code):
    metrics, closed = Metrics(), []
    parts = asyncio.run(_sse_parts(error, metrics, closed))
    assert parts[-1] == "data: [DONE]\n\n"
    event = json.loads(parts[-2].removeprefix("data: "))
    assert set(event) == {"error"}
    _assert_clean_error(event["error"], code)
    chunks = [json.loads(p.removeprefix("data: ")) for p in parts[:-2]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "hi", "more"]
    assert _error_count(metrics, "200", code) == 1 and closed == [1]


@pytest.fixture
def client_for():
    def make(error: Exception) -> tuple[TestClient, Metrics]:
        settings = PlatformSettings(models=[BASE])
        metrics = Metrics()
        gateway = Gateway(settings, Registry(MemoryStore()), DyingBackend(error), metrics)
        return TestClient(create_app(gateway)), metrics

    return make


def _chat(client: TestClient, stream: bool):
    body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize(("error", "code"), ERRORS)
def test_over_http_a_stream_ends_with_the_error_event(client_for, error, code):
    client, metrics = client_for(error)
    response = _chat(client, stream=True)
    assert response.status_code == 200  # sent with the first byte, before the failure
    parts = [p for p in response.text.split("\n\n") if p]
    assert parts[-1] == "data: [DONE]"
    assert json.loads(parts[-3].removeprefix("data: "))["choices"][0]["delta"] == {
        "content": "hello "
    }
    _assert_clean_error(json.loads(parts[-2].removeprefix("data: "))["error"], code)
    assert _error_count(metrics, "200", code) == 1  # the gateway wires the metric into sse


class LostBeforeFirst(DyingBackend):
    """A replica lost before any event, and again on the backend's one retry."""

    def stream(self, base_model, request):
        async def events():
            raise self.error
            yield  # an async generator that fails on its first step

        return events()


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_lost_before_the_first_event_answers_503_replica_lost(stream):
    settings = PlatformSettings(models=[BASE])
    backend = LostBeforeFirst(ReplicaLost(LEAKY))
    client = TestClient(create_app(Gateway(settings, Registry(MemoryStore()), backend, Metrics())))
    response = _chat(client, stream=stream)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    _assert_clean_error(response.json()["error"], "replica_lost")


@pytest.mark.parametrize(("error", "code"), ERRORS)
def test_a_whole_body_reply_cut_mid_way_answers_503_json(client_for, error, code):
    client, metrics = client_for(error)
    response = _chat(client, stream=False)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    _assert_clean_error(response.json()["error"], code)
    assert _error_count(metrics, "503", code) == 1
