"""What a standard load client (guidellm 0.8.1) sends, answered as it needs: its liveness probe
`GET /health` (200; 503 once draining) and its streaming chat body, with vLLM's
`stream_options.continuous_usage_stats` and `ignore_eos`, streamed with the usage once at the end."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.events import Delta, Done, DoneInfo, Usage
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry

BASE = "tiny"
# the body guidellm 0.8.1 posts for a row with a prompt and output_tokens_count 64
GUIDELLM_CHAT = {
    "model": BASE,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_completion_tokens": 64,
    "stop": None,
    "ignore_eos": True,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Compose a post."}]}],
}


class ScriptedBackend:
    """Streams three one-token deltas then the end; records the engine request it was given."""

    def __init__(self) -> None:
        self.requests = []

    def stream(self, base_model, request):
        self.requests.append(request)

        async def events():
            for word in ("a ", "b ", "c"):
                yield Delta(text=word, token_ids=[1])
            info = DoneInfo(
                variant=None,
                version=None,
                strategy="ar",
                reason="test",
                tau=1.0,
                load_capped_steps=0,
                forwards=3,
                drafted_by_depth=[],
                accepted_by_depth=[],
                train_kind=None,
            )
            usage = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
            yield Done(finish_reason="length", usage=usage, specserve=info)

        return events()

    async def replica_stats(self) -> dict:
        return {}


def _client() -> tuple[TestClient, Gateway, ScriptedBackend]:
    backend = ScriptedBackend()
    settings = PlatformSettings(models=[BASE], max_tokens=64)
    gateway = Gateway(settings, Registry(MemoryStore()), backend, Metrics())
    return TestClient(create_app(gateway)), gateway, backend


def test_health_answers_the_liveness_probe_and_503_once_draining():
    client, gateway, _ = _client()
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    gateway.drain.begin(30.0)
    r = client.get("/health")
    assert r.status_code == 503 and r.json() == {"status": "draining"}


def test_the_guidellm_chat_body_streams_with_the_usage_once_at_the_end():
    client, _, backend = _client()
    r = client.post("/v1/chat/completions", json=GUIDELLM_CHAT)
    assert r.status_code == 200, r.text
    parts = [p.removeprefix("data: ") for p in r.text.split("\n\n") if p]
    assert parts[-1] == "[DONE]"
    chunks = [json.loads(p) for p in parts[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "a b c"
    assert [c for c in chunks if "usage" in c] == [chunks[-1]]  # once, after the last choice
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    (request,) = backend.requests
    assert request.params.max_new_tokens == 64 and request.params.ignore_eos


def test_continuous_usage_stats_must_be_a_boolean():
    client, _, _ = _client()
    body = GUIDELLM_CHAT | {"stream_options": {"continuous_usage_stats": "often"}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stream_options.continuous_usage_stats"
