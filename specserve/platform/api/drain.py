"""Draining a gateway before it stops: once `Drain.begin(timeout_s)` is called, new model requests
are refused (503 `shutting_down` + Retry-After) while admitted ones keep streaming; at the
deadline `bounded` ends those still running with `ShuttingDown`, which the reply shapes into an
OpenAI error (an SSE error event + [DONE], or a 503 body). Thread-safe; no Ray here."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from specserve.platform.api.errors import ApiError

T = TypeVar("T")
DRAIN_RETRY_AFTER_S = 2
POLL_S = 0.5  # how often a stream waiting for its next event looks at the deadline


class ShuttingDown(Exception):
    """An admitted request cut at the drain deadline (raised by `Drain.bounded`)."""


def shutting_down_error() -> ApiError:
    return ApiError(
        503,
        "the server is shutting down; retry (another replica or after the restart)",
        "server_error",
        code="shutting_down",
        headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
    )


class Drain:
    """One gateway's drain state. Example: after `begin(30)`, `admit()` raises the 503, and a
    stream still running 30 s later gets `ShuttingDown` from `bounded` at its next look."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._deadline: float | None = None
        self._lock = threading.Lock()

    def begin(self, timeout_s: float) -> None:
        """Stop admission now; admitted requests may run `timeout_s` more. A second call keeps
        the first deadline unless it is earlier (a second signal may shorten it, never extend)."""
        with self._lock:
            deadline = self.clock() + max(0.0, timeout_s)
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline

    @property
    def draining(self) -> bool:
        return self._deadline is not None

    def remaining_s(self) -> float | None:
        """Seconds until admitted requests are cut (0 once passed); None when not draining."""
        deadline = self._deadline
        return None if deadline is None else max(0.0, deadline - self.clock())

    def admit(self) -> None:
        if self.draining:
            raise shutting_down_error()

    async def bounded(self, events: AsyncIterator[T]) -> AsyncIterator[T]:
        """`events`, until they end or the drain deadline passes (then `ShuttingDown`, with the
        pending read cancelled and `events` closed)."""
        try:
            while True:
                read = asyncio.ensure_future(anext(events))
                try:
                    while not read.done():
                        remaining = self.remaining_s()
                        if remaining == 0.0:
                            raise ShuttingDown("the drain deadline passed")
                        wait_s = POLL_S if remaining is None else min(POLL_S, remaining)
                        await asyncio.wait({read}, timeout=wait_s)
                finally:
                    if not read.done():
                        read.cancel()
                        with contextlib.suppress(BaseException):
                            await read
                try:
                    event = read.result()
                except StopAsyncIteration:
                    return
                yield event
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
