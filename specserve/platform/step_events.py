"""The bridge from the engine thread to a request's consumer: each choice's sink puts its steps
on the consumer's asyncio queue (thread-safe), and `delta` turns a step into a `Delta` event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from specserve.platform.events import Delta, decoded_logprobs


class StepEvents:
    """(choice index, step, finished) tuples, put by the engine thread, awaited by one consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def sink(self, index: int) -> Callable[[object, bool], None]:
        """The scheduler's sink for choice `index`."""

        def put(step, finished: bool) -> None:
            # a consumer whose loop already closed (it cancelled, the step raced it) has
            # nobody to tell; raising here would take the engine thread, and every other
            # request, down
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, step, finished))

        return put

    async def get(self) -> tuple[int, object, bool]:
        return await self.queue.get()


def delta(index: int, step, piece: Callable[[int], str]) -> Delta | None:
    """Choice `index`'s step as a Delta event (None when it adds neither text nor logprobs);
    `piece(token_id)`: a token's text as logprobs name it."""
    if step is None or not (step.text or step.logprobs):
        return None
    logprobs = decoded_logprobs(step.logprobs, piece)
    return Delta(text=step.text, token_ids=step.new_ids, logprobs=logprobs, index=index)
