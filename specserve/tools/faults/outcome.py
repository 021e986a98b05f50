"""One request of a fault scenario, sent and classified strictly (`send_chat`): completed only with
a finish chunk and `data: [DONE]`; an OpenAI error (HTTP error JSON, or an SSE error event then
[DONE]) is failed_with_error; a stream that ends without a terminal event is lost; no terminal
event by the deadline is hung; a connection never made is unreachable; anything else malformed."""

from __future__ import annotations

import json
import time
from typing import Literal

import httpx
from pydantic import BaseModel

from specserve.platform.api.http_client import ChatRequest, ChatStream, SseEvent, open_chat

Outcome = Literal["completed", "failed_with_error", "lost", "hung", "unreachable", "malformed"]
OUTCOMES: tuple[str, ...] = Outcome.__args__


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


def take_event(event: SseEvent, state: StreamState) -> bool:
    """Take one SSE event into `state`; True at `[DONE]`."""
    if event == "DONE":
        return True
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


def send_chat(request: ChatRequest, state: StreamState | None = None) -> RequestResult:
    """Send `request` and classify the outcome (never raises for a network or protocol failure);
    its `deadline_s` bounds the whole request. `state` (optional) is filled in as the stream is
    read, for callers watching it live."""
    state = state if state is not None else StreamState()
    fields: dict = {"started": time.monotonic()}
    try:
        with open_chat(request) as stream:
            fields["status"] = stream.status
            if stream.status != 200:
                outcome, code, detail = error_outcome(stream.status, stream.read())
                return RequestResult(
                    outcome=outcome,
                    ended=time.monotonic(),
                    error_code=code,
                    retry_after=stream.headers.get("Retry-After"),
                    detail=detail,
                    **fields,
                )
            outcome, detail = stream_outcome(state, _read_stream(stream, state))
    except (httpx.ConnectError, httpx.ConnectTimeout) as err:
        detail = f"{type(err).__name__}: {err}"
        return RequestResult(outcome="unreachable", ended=time.monotonic(), detail=detail, **fields)
    except httpx.TimeoutException:
        outcome, detail = "hung", f"no terminal event within {request.deadline_s} s"
    except (httpx.HTTPError, OSError) as err:
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


def _read_stream(stream: ChatStream, state: StreamState) -> bool:
    """Read events until [DONE] (True) or the end of the body (False); httpx.ReadTimeout once
    the deadline passes with neither."""
    return any(take_event(event, state) for event in stream.events())
