"""What the scenarios send: `Traffic` (which model, prompts, lengths, deadlines), `Streams` (N
requests at once in threads, watched live), `Load` (workers back to back until stopped, bounded),
`first_success` (fresh probes until one completes) and `Watch` (a check polled on a thread), all
bounded in time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from specserve.platform.api.http_client import ChatRequest, get_json
from specserve.tools.faults.outcome import RequestResult, StreamState, send_chat

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works.",
    "List some facts about the moon.",
    "Describe a busy market in the morning.",
)


class Traffic(BaseModel):
    """Request i asks `model` for `prompts[i]` (cycled), `max_tokens` long, within `deadline_s`;
    probes (recovery checks) are `probe_tokens` long within `probe_deadline_s`."""

    model_config = ConfigDict(frozen=True)

    url: str
    model: str
    prompts: list[str] = Field(default_factory=lambda: list(PROMPTS), min_length=1)
    max_tokens: int = Field(64, gt=0)
    deadline_s: float = Field(120.0, gt=0)
    probe_tokens: int = Field(4, gt=0)
    probe_deadline_s: float = Field(30.0, gt=0)

    def spec(self, i: int, model: str | None = None) -> ChatRequest:
        return ChatRequest(
            url=self.url,
            model=model or self.model,
            prompt=self.prompts[i % len(self.prompts)],
            max_tokens=self.max_tokens,
            deadline_s=self.deadline_s,
            ignore_eos=True,
        )

    def probe(self, i: int, model: str | None = None) -> ChatRequest:
        return self.spec(i, model).model_copy(
            update={"max_tokens": self.probe_tokens, "deadline_s": self.probe_deadline_s}
        )


class Streams:
    """`specs` sent at once, one thread each, from `start()`; `join()` gives their results."""

    def __init__(self, specs: list[ChatRequest]) -> None:
        self.specs = specs
        self.states = [StreamState() for _ in specs]
        self.results: list[RequestResult | None] = [None] * len(specs)
        self._threads = [
            threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(len(specs))
        ]

    def _send(self, i: int) -> None:
        self.results[i] = send_chat(self.specs[i], self.states[i])

    def start(self) -> Streams:
        for thread in self._threads:
            thread.start()
        return self

    def streaming(self) -> int:
        """Requests that got a first token and have not ended."""
        return sum(
            s.first_token is not None and r is None for s, r in zip(self.states, self.results)
        )

    def in_flight(self) -> int:
        return sum(r is None for r in self.results)

    def wait_streaming(self, limit_s: float, poll_s: float = 0.02) -> int:
        """Wait (up to `limit_s`) until every request has a first token or has ended; how many
        are streaming then."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all(s.first_token is not None or r is not None for s, r in self._pairs()):
                break
            time.sleep(poll_s)
        return self.streaming()

    def _pairs(self):
        return zip(self.states, self.results)

    def join(self) -> list[RequestResult]:
        """Every result (each request ends by its own deadline)."""
        for thread in self._threads:
            thread.join()
        return [r for r in self.results if r is not None]


class Load:
    """`workers` threads, each calling `send(i)` for the next request number `i` back to back from
    `start()` until `stop()`, at most `limit` requests in all."""

    def __init__(self, send: Callable[[int], RequestResult], workers: int, limit: int) -> None:
        self.send, self.limit = send, limit
        self.results: list[RequestResult] = []
        self._sent, self._lock, self._stop = 0, threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]

    def _take(self) -> int | None:
        with self._lock:
            if self._stop.is_set() or self._sent >= self.limit:
                return None
            self._sent += 1
            return self._sent - 1

    def _work(self) -> None:
        while (i := self._take()) is not None:
            self.results.append(self.send(i))

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, wait: bool = True) -> list[RequestResult]:
        """No new requests; with `wait`, until those in flight end (each by its deadline)."""
        self._stop.set()
        if wait:
            for thread in self._threads:
                thread.join()
        return list(self.results)


def traffic_load(traffic: Traffic, workers: int, limit: int, model: str | None = None) -> Load:
    """A `Load` sending `traffic`'s chat requests (to `model`, else the traffic's own)."""
    return Load(lambda i: send_chat(traffic.spec(i, model)), workers, limit)


def first_success(
    traffic: Traffic,
    since: float,
    limit_s: float,
    accept: Callable[[RequestResult], bool] | None = None,
    model: str | None = None,
    pause_s: float = 0.25,
) -> tuple[float | None, list[RequestResult]]:
    """Probes one after another until one completes (and passes `accept`): (seconds from `since`,
    a `time.monotonic()` reading, to its end, or None past `limit_s`; every probe sent)."""
    probes: list[RequestResult] = []
    while time.monotonic() - since < limit_s:
        result = send_chat(traffic.probe(len(probes), model))
        probes.append(result)
        if result.outcome == "completed" and (accept is None or accept(result)):
            return round(result.ended - since, 3), probes
        time.sleep(pause_s)
    return None, probes


def health(url: str, timeout: float = 5.0) -> dict | None:
    """GET /healthz as JSON; None when it cannot be read."""
    body = get_json(url.rstrip("/") + "/healthz", timeout=timeout)
    return body if isinstance(body, dict) else None


def store_ok(url: str) -> bool:
    body = health(url)
    return body is not None and body.get("store") == "ok"


def store_down(url: str) -> bool:
    body = health(url)
    return body is not None and body.get("store") != "ok"


class Watch:
    """`check()` polled on a thread from `start()` until it holds or `limit_s` passes: `seconds`
    from `since` to the first time it held (None: not yet, or never)."""

    def __init__(
        self, check: Callable[[], bool], since: float, limit_s: float, poll_s: float = 0.1
    ) -> None:
        self.seconds: float | None = None
        self._stop = threading.Event()
        self._args = (check, since, limit_s, poll_s)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        check, since, limit_s, poll_s = self._args
        while not self._stop.is_set() and time.monotonic() - since < limit_s:
            if check():
                self.seconds = round(time.monotonic() - since, 3)
                return
            self._stop.wait(poll_s)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def wait(self) -> float | None:
        """Wait until the check held or the limit passed; the seconds (None: it never held)."""
        self._thread.join()
        return self.seconds

    def stop(self) -> float | None:
        """Stop polling now; the seconds seen so far."""
        self._stop.set()
        self._thread.join()
        return self.seconds
