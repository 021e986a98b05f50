"""Error hygiene at the gateway: a model server's error (as Ray wraps it: a traceback with ANSI
codes, pid, IP and paths) reaches the client as a short OpenAI error naming the right `param`,
with the request id in the body and the `x-request-id` header; empty content is refused before
any backend call; `param` is OpenAI's bare field name; the OpenAPI schema lists the errors."""

from __future__ import annotations

import json
import logging
import re

import pytest
from done_event import done_event
from fastapi.testclient import TestClient
from ray.exceptions import RayTaskError

from specserve.adapters.errors import MissingAdapterFileError
from specserve.platform.api.errors import field_param, short_message
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.events import Delta, Done
from specserve.platform.service import Overloaded
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry

BASE = "tiny"
IP, PID, PATH = "10.1.2.3", 4242, "/home/ray/specserve/engine/decode/core.py"
TOO_LONG = "prompt: 2000 tokens + max_new_tokens 16 exceed the model's context of 1024 positions"
LEAKS = re.compile(rf"Traceback|pid|{re.escape(IP)}|/home/|\x1b|actor_id|File \"")


def ray_wrapped(cause: Exception) -> Exception:
    """`cause` as a replica's exception reaches the gateway: RayTaskError(cause's type)."""
    try:
        raise cause
    except Exception as err:  # noqa: BLE001 - any cause, as a replica would raise it
        traceback = (
            "Traceback (most recent call last):\n"
            f'  File "{PATH}", line 138, in start\n'
            f"    raise {type(err).__name__}(...)\n"
            f"{type(err).__name__}: {err}"
        )
        wrapped = RayTaskError(
            "ModelServer.generate",
            traceback,
            err,
            pid=PID,
            ip=IP,
            actor_repr="ModelServer(actor_id=0123abcd)",
            actor_id="0123abcd",
        )
    return wrapped.as_instanceof_cause()


def _done() -> Done:
    return done_event(1, "stop")


class FakeBackend:
    """Raises `error` before the first event (None: answers "ok"); counts its calls."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.calls = error, 0

    def stream(self, base_model, request):
        self.calls += 1

        async def events():
            if self.error is not None:
                raise self.error
            yield Delta(text="ok", token_ids=[1])
            yield _done()

        return events()

    async def replica_stats(self) -> dict:
        return {}


def _client(backend: FakeBackend) -> TestClient:
    gateway = Gateway(PlatformSettings(models=[BASE]), Registry(MemoryStore()), backend, Metrics())
    return TestClient(create_app(gateway), raise_server_exceptions=False)


def _chat(client: TestClient, messages=None, headers=None, **fields):
    messages = messages or [{"role": "user", "content": "hi"}]
    body = {"model": BASE, "messages": messages} | fields
    return client.post("/v1/chat/completions", json=body, headers=headers)


def _assert_clean(response) -> dict:
    """The error of `response`: no leak, and its request id is the response header's."""
    assert not LEAKS.search(response.text), response.text
    error = response.json()["error"]
    assert error["request_id"] == response.headers["x-request-id"]
    return error


def test_ray_wrapped_refusal_is_short_and_names_the_prompt(caplog):
    wrapped = ray_wrapped(ValueError(TOO_LONG))
    assert LEAKS.search(str(wrapped))  # the test's error does carry everything
    client = _client(FakeBackend(wrapped))
    with caplog.at_level(logging.INFO, logger="specserve.platform.api.refusals"):
        chat = _chat(client, headers={"x-request-id": "trace-7"})
    assert chat.status_code == 400 and chat.headers["x-request-id"] == "trace-7"
    error = _assert_clean(chat)
    assert (error["message"], error["param"], error["code"]) == (
        TOO_LONG,
        "messages",
        "invalid_prompt",
    )
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "trace-7" in logged and PATH in logged  # the detail goes to the log, with the id
    text = client.post("/v1/completions", json={"model": BASE, "prompt": "w1"})
    assert text.status_code == 400 and _assert_clean(text)["param"] == "prompt"


@pytest.mark.parametrize(
    ("cause", "status", "code"),
    [
        (Overloaded(f"queue full at {IP} pid={PID}"), 503, "overloaded"),
        (MissingAdapterFileError(f"{PATH}: adapter_model.safetensors missing"), 500, None),
        (RuntimeError(f"CUDA error in {PATH}"), 500, "internal_error"),
    ],
)
def test_other_wrapped_errors_answer_clean(cause, status, code):
    response = _chat(_client(FakeBackend(ray_wrapped(cause))))
    assert response.status_code == status
    error = _assert_clean(response)
    assert error["code"] == (code or cause.code)


def test_short_message_is_the_cause_first_line_capped():
    noisy = ValueError("\x1b[31mprompt: too long\x1b[0m\nsecond line at /srv/x.py")
    assert short_message(ray_wrapped(noisy)) == "prompt: too long"
    assert len(short_message(ValueError("x" * 5000))) == 300
    assert short_message(ValueError("")) == "ValueError"


def test_every_response_carries_a_request_id():
    client = _client(FakeBackend())
    ok = _chat(client)
    assert ok.status_code == 200 and re.fullmatch(r"req-[0-9a-f]{32}", ok.headers["x-request-id"])
    echoed = _chat(client, headers={"x-request-id": "abc-123.x:y_z"})
    assert echoed.headers["x-request-id"] == "abc-123.x:y_z"
    for insane in ("has spaces", "x" * 129, 'quote"d'):
        replaced = _chat(client, headers={"x-request-id": insane}).headers["x-request-id"]
        assert replaced.startswith("req-") and replaced != insane
    with client.stream("POST", "/v1/chat/completions", json=_body(stream=True)) as stream:
        assert stream.headers["x-request-id"].startswith("req-")
        assert "[DONE]" in stream.read().decode()
    for other in (client.get("/v1/models"), client.get("/healthz"), client.get("/nope")):
        assert other.headers["x-request-id"].startswith("req-")
    assert _assert_clean(client.get("/nope"))["code"] is None


def test_request_id_in_an_oversized_body_and_a_stream_cut_before_start():
    client = _client(FakeBackend(ray_wrapped(ValueError(TOO_LONG))))
    big = client.post("/v1/completions", json={"model": BASE, "prompt": "w" * 2_000_000})
    assert big.status_code == 413 and _assert_clean(big)["code"] == "body_too_large"
    streamed = _chat(client, stream=True)
    assert streamed.status_code == 400 and _assert_clean(streamed)["param"] == "messages"


def _body(**fields) -> dict:
    return {"model": BASE, "messages": [{"role": "user", "content": "hi"}]} | fields


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": ""}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
        [{"role": "user", "content": [{"type": "text", "text": ""}]}],
    ],
)
def test_empty_content_is_refused_before_the_backend(messages):
    backend = FakeBackend()
    response = _chat(_client(backend), messages=messages)
    assert response.status_code == 400 and backend.calls == 0
    error = _assert_clean(response)
    assert error["param"] == "messages" and "non-empty content" in error["message"]


def test_some_content_reaches_the_backend():
    """Only what the model server refuses (every content empty): a system message alone is fine."""
    backend = FakeBackend()
    response = _chat(_client(backend), messages=[{"role": "system", "content": "be brief"}])
    assert response.status_code == 200 and backend.calls == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 17}, "n"),
        ({"temperature": 9}, "temperature"),
        ({"stop": ["a", ""]}, "stop"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "x", "content": "b"}]},
            "messages[1].role",
        ),
        ({"stream_options": {"include_usage": "maybe"}}, "stream_options.include_usage"),
    ],
)
def test_param_is_openais_bare_field_name(fields, param):
    response = _client(FakeBackend()).post("/v1/chat/completions", json=_body(**fields))
    assert response.status_code == 400
    error = _assert_clean(response)
    assert error["param"] == param and error["message"].startswith(f"{param}: ")


def test_field_param_drops_the_request_part_and_union_tags():
    assert field_param(("body", "n")) == "n"
    assert field_param(("body", "messages", 1, "content", "list[TextPart]", 0, "text")) == (
        "messages[1].content[0].text"
    )
    assert field_param(("body", "stop", "str")) == "stop"
    assert field_param(("body",)) is None


def test_openapi_lists_the_error_responses():
    schema = _client(FakeBackend()).get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert {"400", "401", "404", "413", "500", "503"} <= set(responses)
        assert "422" not in responses  # request validation answers 400
        ref = responses["400"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorBody")
    assert {"401", "503"} <= set(schema["paths"]["/v1/models"]["get"]["responses"])
    detail = schema["components"]["schemas"]["ErrorDetail"]["properties"]
    assert {"message", "type", "param", "code", "request_id"} <= set(detail)


def test_fuzzed_error_bodies_never_leak():
    """A bounded schemathesis run over the OpenAI routes, the backend raising a leaky Ray error:
    no 5xx, and no body with a traceback, pid, address or path."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    client = _client(FakeBackend(ray_wrapped(ValueError(TOO_LONG))))
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    problems = []
    for op in schema.get_all_operations():
        operation = op.ok()
        if not operation.path.startswith("/v1/"):
            continue

        @settings(
            max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call()
            if response.status_code >= 500 or LEAKS.search(response.text):
                problems.append((case.path, response.status_code, response.text[:200]))
            if response.status_code >= 400:
                body = json.loads(response.text)
                if [body["error"]["request_id"]] != response.headers["x-request-id"]:
                    problems.append((case.path, "request id", response.text[:200]))

        check()
    assert problems == []
