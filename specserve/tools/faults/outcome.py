"""One request of a fault scenario, sent and classified strictly (`send_chat`): completed only with
a finish chunk and `data: [DONE]`; an OpenAI error (HTTP error JSON, or an SSE error event then
[DONE]) is failed_with_error; a stream that ends without a terminal event is lost; no terminal
event by the deadline is hung; a connection never made is unreachable; anything else malformed."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["completed", "failed_with_error", "lost", "hung", "unreachable", "malformed"]
OUTCOMES: tuple[str, ...] = Outcome.__args__


class ChatSpec(BaseModel):
    """One streaming chat completion: greedy, `ignore_eos` so it streams `max_tokens` tokens;
    `deadline_s` bounds the whole request (past it, no terminal event yet: hung)."""

    model_config = ConfigDict(frozen=True)

    url: str
    model: str
    prompt: str
    max_tokens: int = Field(gt=0)
    deadline_s: float = Field(120.0, gt=0)
    ignore_eos: bool = True

    def body(self) -> dict:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": self.ignore_eos,
        }


class RequestResult(BaseModel):
    """What became of one request; times are `time.monotonic()` readings."""

    outcome: Outcome
    started: float
    ended: float
    status: int | None = None  # HTTP status, when a status line came
    error_code: str | None = None  # the OpenAI error's `code` (HTTP body or SSE error event)
    retry_after: str | None = None  # the Retry-After header of an error response
    first_token: float | None = None  # when the first content chunk came
    tokens: int = 0  # content chunks received
    version: int | None = None  # `specserve.version` of the finish chunk (a variant's version)
    detail: str = ""


class StreamState(BaseModel):
    """What a stream has shown so far (filled in while its lines are read)."""

    tokens: int = 0
    first_token: float | None = None
    finished: bool = False  # a chunk with a finish_reason came
    error_code: str | None = None
    errored: bool = False  # an SSE error event came
    version: int | None = None


def read_event(line: bytes, state: StreamState) -> bool:
    """Take one SSE line into `state`; True at `data: [DONE]`. ValueError on a `data:` line
    that is not JSON."""
    text = line.decode(errors="replace").strip()
    if not text.startswith("data:"):
        return False
    payload = text[5:].strip()
    if payload == "[DONE]":
        return True
    event = json.loads(payload)
    if not isinstance(event, dict):
        raise ValueError(f"not an event object: {payload[:80]}")  # noqa: TRY004 - bad data
    if "error" in event:
        state.errored = True
        state.error_code = (event.get("error") or {}).get("code")
        return False
    for choice in event.get("choices") or []:
        if (choice.get("delta") or {}).get("content"):
            state.tokens += 1
            state.first_token = state.first_token or time.monotonic()
        if choice.get("finish_reason"):
            state.finished = True
            state.version = (event.get("specserve") or {}).get("version")
    return False


def stream_outcome(state: StreamState, done: bool) -> tuple[Outcome, str]:
    """A stream's outcome from what it showed: `done` says [DONE] came."""
    if not done:
        return "lost", "the stream ended with no terminal event"
    if state.errored:
        return "failed_with_error", "SSE error event, then [DONE]"
    if state.finished:
        return "completed", ""
    return "malformed", "[DONE] without a finish chunk or an error event"


def error_outcome(status: int, body: bytes) -> tuple[Outcome, str | None, str]:
    """(outcome, error code, detail) of a non-200 answer: an OpenAI error body or malformed."""
    try:
        error = json.loads(body)["error"]
        return "failed_with_error", error.get("code"), str(error.get("message", ""))[:200]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "malformed", None, f"HTTP {status}, not an OpenAI error body: {body[:120]!r}"


@contextlib.contextmanager
def _connection(url: str, timeout: float) -> Iterator[http.client.HTTPConnection]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        yield conn
    finally:
        conn.close()


def send_chat(spec: ChatSpec, state: StreamState | None = None) -> RequestResult:
    """Send `spec` and classify the outcome (never raises for a network or protocol failure).
    `state` (optional) is filled in as the stream is read, for callers watching it live."""
    state = state if state is not None else StreamState()
    started = time.monotonic()
    deadline = started + spec.deadline_s
    fields: dict = {"started": started}
    try:
        with _connection(spec.url, spec.deadline_s) as conn:
            try:
                conn.connect()
            except OSError as err:
                detail = f"{type(err).__name__}: {err}"
                return RequestResult(
                    outcome="unreachable", ended=time.monotonic(), detail=detail, **fields
                )
            sock = conn.sock  # getresponse() drops conn.sock when the server will close
            headers = {"Content-Type": "application/json"}
            conn.request("POST", "/v1/chat/completions", json.dumps(spec.body()), headers)
            resp = conn.getresponse()
            fields["status"] = resp.status
            if resp.status != 200:
                outcome, code, detail = error_outcome(resp.status, resp.read())
                return RequestResult(
                    outcome=outcome,
                    ended=time.monotonic(),
                    error_code=code,
                    retry_after=resp.getheader("Retry-After"),
                    detail=detail,
                    **fields,
                )
            done = _read_stream(sock, resp, state, deadline)
            outcome, detail = stream_outcome(state, done)
    except TimeoutError:
        outcome, detail = "hung", f"no terminal event within {spec.deadline_s} s"
    except (OSError, http.client.HTTPException) as err:
        outcome, detail = "lost", f"{type(err).__name__}: {err}"
    except ValueError as err:
        outcome, detail = "malformed", f"bad event: {err}"[:200]
    return RequestResult(
        outcome=outcome,
        ended=time.monotonic(),
        error_code=state.error_code,
        first_token=state.first_token,
        tokens=state.tokens,
        version=state.version,
        detail=detail,
        **fields,
    )


def _read_stream(sock, resp, state: StreamState, deadline: float) -> bool:
    """Read SSE lines until [DONE] (True) or the end of the body (False); TimeoutError once
    `deadline` passes with neither."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        line = resp.readline()  # de-chunked; IncompleteRead when the body is cut mid-chunk
        if not line:
            return False
        if read_event(line, state):
            return True
