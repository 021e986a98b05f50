"""The one HTTP client of the admin CLI and the tools (httpx, one connection per request, no proxy
from the environment): plain calls (`send`, `get_text`, `get_json`), streaming chat completions
(`ChatRequest` opened by `open_chat` as a `ChatStream`) and the one SSE reader (`sse_events`)."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

NETWORK_ERRORS = (httpx.HTTPError, OSError)  # not reached, cut, timed out, or a 4xx/5xx status
REQUEST_ERRORS = (*NETWORK_ERRORS, ValueError)  # ... or an answer that is not the JSON expected

SseEvent = dict | Literal["DONE"]


@functools.cache
def client() -> httpx.Client:
    """This process's client: no keep-alive (every request its own connection, as a fault needs),
    no connection limit, nothing taken from the environment (proxies)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    return httpx.Client(limits=limits, trust_env=False)


def send(
    method: str, url: str, body: dict | None = None, token: str | None = None, timeout: float = 60.0
) -> httpx.Response:
    """One plain request with an optional JSON body and bearer token, redirects followed; raises
    httpx.HTTPStatusError on a 4xx/5xx answer, httpx.TransportError when it did not get one."""
    headers = {"Content-Type": "application/json"} | (
        {"Authorization": f"Bearer {token}"} if token else {}
    )
    content = json.dumps(body).encode() if body is not None else None
    response = client().request(
        method, url, content=content, headers=headers, timeout=timeout, follow_redirects=True
    )
    return response.raise_for_status()


def get_text(url: str, timeout: float = 10.0) -> str | None:
    """GET `url` as text; None on any failure (not reached, a 4xx/5xx status, a broken body)."""
    try:
        return send("GET", url, timeout=timeout).text
    except REQUEST_ERRORS:
        return None


def get_json(url: str, timeout: float = 10.0) -> Any:
    """GET `url` as JSON; None on any failure."""
    try:
        return send("GET", url, timeout=timeout).json()
    except REQUEST_ERRORS:
        return None


class ChatRequest(BaseModel):
    """One streaming chat completion (greedy, usage in the last chunk) to `url`; `deadline_s`
    bounds the whole request (connecting, each wait, and the stream to its end)."""

    model_config = ConfigDict(frozen=True)

    url: str
    model: str
    prompt: str
    max_tokens: int = Field(gt=0)
    deadline_s: float = Field(600.0, gt=0)
    ignore_eos: bool = False  # True: stream all `max_tokens` tokens
    token: str | None = None

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


def sse_events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of SSE `lines`: each `data:` line's JSON object, "DONE" for `data: [DONE]`;
    other lines are skipped. ValueError on a `data:` line that is not a JSON object."""
    for line in lines:
        text = line.strip()
        if not text.startswith("data:"):
            continue
        payload = text[5:].strip()
        if payload == "[DONE]":
            yield "DONE"
            continue
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise ValueError(f"not an event object: {payload[:80]}")  # noqa: TRY004 - bad data
        yield event


class ChatStream:
    """An answered `ChatRequest`: its status and headers, its body (`read`) or its SSE events
    (`events`), and `cut` (shut its socket down hard, as a vanished client does)."""

    def __init__(self, response: httpx.Response, deadline: float) -> None:
        self.response, self.deadline = response, deadline

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self.response.headers

    def read(self) -> bytes:
        return self.response.read()

    def events(self) -> Iterator[SseEvent]:
        """The body's SSE events until it ends; httpx.ReadTimeout once the deadline has passed
        (the stream is cut then), httpx.TransportError when it breaks, ValueError on bad data."""
        try:
            yield from sse_events(self.response.iter_lines())
        except httpx.TransportError:
            self._check_deadline()
            raise
        self._check_deadline()

    def _check_deadline(self) -> None:
        if time.monotonic() >= self.deadline:
            raise httpx.ReadTimeout("the stream did not end by its deadline")

    def cut(self) -> None:
        """Shut the connection down (both ways): a read blocked on it returns at once."""
        stream = self.response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with contextlib.suppress(OSError):
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def open_chat(request: ChatRequest) -> Iterator[ChatStream]:
    """`request` sent; yields its `ChatStream` once the status line came, body unread, and closes
    it after. At the request's deadline the stream is cut (its reads end: `events` says so)."""
    deadline = time.monotonic() + request.deadline_s
    headers = {"Authorization": f"Bearer {request.token}"} if request.token else {}
    url = request.url.rstrip("/") + "/v1/chat/completions"
    with client().stream(
        "POST", url, json=request.body(), headers=headers, timeout=request.deadline_s
    ) as response:
        stream = ChatStream(response, deadline)
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), stream.cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            yield stream
        finally:
            watchdog.cancel()


def has_content(event: SseEvent) -> bool:
    """The event is a chunk carrying generated text."""
    return isinstance(event, dict) and any(
        (c.get("delta") or {}).get("content") for c in event.get("choices") or []
    )
