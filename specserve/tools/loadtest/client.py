"""The HTTP side of the load scenarios: what a scenario sends (`Traffic`, one `ChatRequest` at a
time, opened by `open_chat`, read by `sse_events`), plain GETs (`fetch`), and worker threads
(`Tickets`, `running`, `run_all`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

CLIENT_ERRORS = (OSError, http.client.HTTPException, json.JSONDecodeError)  # a request that broke


class ChatRequest(BaseModel):
    """One streaming chat completion to send (greedy, usage in the last chunk)."""

    model_config = ConfigDict(frozen=True)

    url: str
    model: str
    prompt: str
    max_tokens: int = Field(gt=0)
    timeout: float = Field(600.0, gt=0)
    token: str | None = None


class Traffic(BaseModel):
    """What a scenario sends where: request i asks `models[i]` for `prompts[i]` (both cycled)."""

    model_config = ConfigDict(frozen=True)

    url: str
    models: list[str] = Field(min_length=1)
    prompts: list[str] = Field(min_length=1)
    max_tokens: int = Field(gt=0)
    timeout: float = Field(600.0, gt=0)

    def request(self, i: int, prompt: int | None = None) -> ChatRequest:
        """Request `i`, asking for prompt number `prompt` (default: `i`)."""
        return ChatRequest(
            url=self.url,
            model=self.models[i % len(self.models)],
            prompt=self.prompts[(i if prompt is None else prompt) % len(self.prompts)],
            max_tokens=self.max_tokens,
            timeout=self.timeout,
        )

    def rotated(self, by: int) -> Traffic:
        """The same traffic starting `by` prompts later (each client process its own order)."""
        return self.model_copy(update={"prompts": self.prompts[by:] + self.prompts[:by]})


@contextlib.contextmanager
def open_chat(request: ChatRequest) -> Iterator[http.client.HTTPConnection]:
    """`request` sent; yields the connection, its response still unread, and closes it after."""
    body = {
        "model": request.model,
        "messages": [{"role": "user", "content": request.prompt}],
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Content-Type": "application/json"} | (
        {"Authorization": f"Bearer {request.token}"} if request.token else {}
    )
    parts = urllib.parse.urlsplit(request.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=request.timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        yield conn
    finally:
        conn.close()


def sse_events(lines: Iterable[bytes]) -> Iterator[dict | str]:
    """The stream's events: each `data:` line's JSON chunk, "DONE" for `data: [DONE]`."""
    for raw in lines:
        line = raw.decode().strip()
        if line.startswith("data: "):
            yield "DONE" if line == "data: [DONE]" else json.loads(line[6:])


def has_content(chunk: dict | str) -> bool:
    """The event is a chunk carrying generated text."""
    return isinstance(chunk, dict) and any(
        c.get("delta", {}).get("content") for c in chunk.get("choices", [])
    )


def fetch(url: str, path: str, timeout: float = 10.0) -> str | None:
    """GET `path` as text; None on any error (the probes treat that as 'not known')."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as resp:
            return resp.read().decode()
    except (OSError, http.client.HTTPException, ValueError):
        return None


class Tickets:
    """Request numbers 0, 1, 2, ... handed out to worker threads, up to `limit` (None: no end)."""

    def __init__(self, limit: int | None = None) -> None:
        self._next, self._limit, self._lock = 0, limit, threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            if self._limit is not None and self._next >= self._limit:
                return None
            self._next += 1
            return self._next - 1


@contextlib.contextmanager
def running(work: Callable[[int], None], threads: int) -> Iterator[None]:
    """`work(0)` ... `work(threads - 1)`, one thread each, started on entry, joined on exit."""
    started = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in started:
        t.start()
    try:
        yield
    finally:
        for t in started:
            t.join()


def run_all(work: Callable[[int], None], threads: int) -> None:
    """`running` with nothing to do meanwhile: returns when every thread is done."""
    with running(work, threads):
        pass
