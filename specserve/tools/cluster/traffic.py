"""The demo's requests: `Recorder` (every streaming request's result, and how many are in flight),
`Load` (N streaming clients back to back until stopped, bounded in count), and `ask` (one plain,
non-streaming completion whose `specserve` object says which replica served it and how)."""

from __future__ import annotations

import threading
import time

import httpx
from pydantic import BaseModel

from specserve.platform.api.http_client import ChatRequest, send
from specserve.tools.faults.outcome import RequestResult, send_chat


class Recorder:
    """Results of every request sent through it, in the order they ended; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: list[RequestResult] = []
        self._started: dict[int, float] = {}  # requests in flight: id -> time.monotonic() sent
        self._next = 0

    def send(self, spec: ChatRequest) -> RequestResult:
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._started[key] = time.monotonic()
        try:
            result = send_chat(spec)
        finally:
            with self._lock:
                self._started.pop(key)
        with self._lock:
            self._results.append(result)
        return result

    def oldest_in_flight(self) -> float | None:
        """When the oldest request still in flight was sent (None: none is)."""
        with self._lock:
            return min(self._started.values(), default=None)

    def results(self) -> list[RequestResult]:
        with self._lock:
            return list(self._results)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._started)


class Answer(BaseModel):
    """A non-streaming completion's figures: who served it and what the draft tokens did."""

    replica: str
    version: int | None
    strategy: str
    tau: float
    forwards: int
    completion_tokens: int
    accepted: int  # draft tokens accepted in all (the sum over depths)
    text: str


def ask(url: str, model: str, prompt: str, max_tokens: int, strategy: str = "lookahead") -> Answer:
    """One greedy completion of `prompt`, `strategy` asked for; raises httpx.HTTPError on a
    4xx/5xx answer or none."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "speculation": strategy,
    }
    answer = send("POST", f"{url}/v1/completions", body, timeout=120).json()
    info = answer["specserve"]
    return Answer(
        replica=info["replica"],
        version=info.get("version"),
        strategy=info["strategy"],
        tau=info["tau"],
        forwards=info["forwards"],
        completion_tokens=answer["usage"]["completion_tokens"],
        accepted=sum(info["accepted_by_depth"]),
        text=answer["choices"][0]["text"],
    )


def admin(url: str, token: str, path: str, body: dict, tries: int = 5) -> dict:
    """POST an admin call; the JSON answer. A 503 (registry briefly unreachable: "retry
    shortly") is tried again after a second, up to `tries` times; other refusals raise."""
    for attempt in range(1, tries + 1):
        try:
            return send("POST", f"{url}{path}", body, token, timeout=60).json()
        except httpx.HTTPStatusError as err:
            code = err.response.status_code
            if code != 503 or attempt == tries:
                raise RuntimeError(f"{path}: HTTP {code}: {err.response.content[:300]!r}") from None
        time.sleep(1.0)
    raise AssertionError("unreachable")
