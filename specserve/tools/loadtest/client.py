"""The HTTP side of the load scenarios: what a scenario sends (`Traffic`, one `ChatRequest` at a
time, opened by the shared client's `open_chat`), plain GETs (`fetch`), and worker threads
(`Tickets`, `running`, `run_all`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from specserve.platform.api.http_client import ChatRequest, get_text


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
            deadline_s=self.timeout,
        )

    def rotated(self, by: int) -> Traffic:
        """The same traffic starting `by` prompts later (each client process its own order)."""
        return self.model_copy(update={"prompts": self.prompts[by:] + self.prompts[:by]})


def fetch(url: str, path: str, timeout: float = 10.0) -> str | None:
    """GET `path` as text; None on any error (the probes treat that as 'not known')."""
    return get_text(url.rstrip("/") + path, timeout=timeout)


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
