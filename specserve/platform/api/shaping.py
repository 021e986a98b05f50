"""Model-server events as OpenAI responses: one JSON body (`collect`) or server-sent events
(`sse`), for chat and text completions, with the `specserve` object of the final event.
`Reply` holds one response's id, its request id, creation time, token timing and (when the
variant captures traffic) the text of choice 0. A model server failing mid-reply
(`stream_failure`) ends it with an OpenAI error: a 503 body, or a final SSE error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from specserve.platform.api.drain import ShuttingDown, shutting_down_error
from specserve.platform.api.errors import ApiError
from specserve.platform.api.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Choice,
    Chunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    TextCompletion,
    TextCompletionChunk,
)
from specserve.platform.events import DecodedLogprob, Delta, Done, DoneInfo, Usage
from specserve.platform.service import ReplicaLost

log = logging.getLogger(__name__)

OnDone = Callable[["Reply", Done], None]  # called once the final event arrived
OnStreamError = Callable[[str, str], None]  # (endpoint, code): a stream ended by an error event
STREAM_RETRY_AFTER_S = 1


def stream_failure(err: Exception, request_id: str) -> ApiError:
    """The client's view of a model server failing mid-reply: a short 503 (no traceback, pid, IP
    or path; those go to the log under `request_id`)."""
    if isinstance(err, ShuttingDown):
        log.warning("%s: cut at the drain deadline", request_id)
        return shutting_down_error()
    if isinstance(err, ReplicaLost):
        message, code = "the model server handling this request was lost; retry", "replica_lost"
    else:
        message, code = "the model server failed while generating; retry", "stream_error"
    log.error("%s: %s: %s", request_id, code, err, exc_info=err)
    headers = {"Retry-After": str(STREAM_RETRY_AFTER_S)}
    return ApiError(503, message, "server_error", code=code, headers=headers)


class Reply:
    """Per-response bookkeeping: ids, timing of tokens; builds the response models (responses.py)."""

    def __init__(
        self,
        endpoint: str,
        base_model: str,
        model: str,
        started: float,
        request_id: str | None = None,
        n: int = 1,
        keep_text: bool = False,
    ) -> None:
        """`request_id`: the HTTP request's (`x-request-id`); default: this reply's id. `n`: the
        choices the model server streams (events tagged by `index`). `keep_text`: keep choice
        0's text (`text`) for traffic capture."""
        self.n = n
        self._kept: list[str] | None = [] if keep_text else None
        self.endpoint, self.base_model, self.model, self.started = (
            endpoint,
            base_model,
            model,
            started,
        )
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.request_id = request_id or self.id
        self.created = int(time.time())
        self.ttft: float | None = None
        self.gaps: list[float] = []
        self._last: float | None = None
        self.text_offsets: dict[int, int] = {}  # completions logprobs, per choice: text so far

    def took(self, delta: Delta) -> None:
        """A delta arrived: its timing, and its text when kept."""
        self.tick()
        if self._kept is not None and delta.index == 0:
            self._kept.append(delta.text)

    @property
    def text(self) -> str | None:
        """Choice 0's text so far (None: not kept)."""
        return None if self._kept is None else "".join(self._kept)

    def tick(self) -> None:
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self.started
        else:
            self.gaps.append(now - self._last)
        self._last = now

    def whole(self, choices: list, usage: Usage, specserve: DoneInfo) -> Completion:
        """The whole response around `choices` (`choice`s)."""
        kind = ChatCompletion if self.endpoint == "chat" else TextCompletion
        return kind(**self._ids(), choices=choices, usage=usage, specserve=specserve)

    def chunk(
        self, choices: list, specserve: DoneInfo | None = None, usage: Usage | None = None
    ) -> Chunk:
        """A stream chunk around `choices` (`chunk_choice`s), with a choice's `specserve` on its
        last chunk, the `usage` on the one before `[DONE]`."""
        kind = ChatCompletionChunk if self.endpoint == "chat" else TextCompletionChunk
        return kind(**self._ids(), choices=choices, specserve=specserve, usage=usage)

    def _ids(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def chunk_choice(
        self,
        text: str,
        finish_reason: str | None,
        logprobs: list[DecodedLogprob] | None = None,
        index: int = 0,
    ) -> ChunkChoice:
        """A stream chunk's choice; `logprobs`: those of the delta's tokens (when asked)."""
        if self.endpoint == "chat":
            delta = ChatDelta(content=text or None)
            shaped = None if logprobs is None else ChatLogprobs.of(logprobs)
            return ChatChunkChoice(
                index=index, delta=delta, finish_reason=finish_reason, logprobs=shaped
            )
        return self._completion_choice(text, finish_reason, logprobs, index)

    def choice(
        self,
        text: str,
        finish_reason: str,
        logprobs: list[DecodedLogprob] | None = None,
        index: int = 0,
    ) -> Choice:
        """The whole response's choice; `logprobs`: every completion token's (when asked)."""
        if self.endpoint == "chat":
            message = AssistantMessage(content=text)
            shaped = None if logprobs is None else ChatLogprobs.of(logprobs)
            return ChatChoice(
                index=index, message=message, finish_reason=finish_reason, logprobs=shaped
            )
        return self._completion_choice(text, finish_reason, logprobs, index)

    def _completion_choice(
        self,
        text: str,
        finish_reason: str | None,
        logprobs: list[DecodedLogprob] | None,
        index: int,
    ) -> CompletionChoice:
        """A text choice; its logprobs' text offsets continue the count of the choice so far."""
        shaped = None
        if logprobs is not None:
            start = self.text_offsets.get(index, 0)
            shaped = CompletionLogprobs.of(logprobs, start)
            self.text_offsets[index] = start + sum(len(lp.token) for lp in logprobs)
        return CompletionChoice(
            index=index, text=text, finish_reason=finish_reason, logprobs=shaped
        )


async def collect(
    reply: Reply,
    first: Delta | Done,
    events: AsyncIterator[Delta | Done],
    http: Request,
    on_done: OnDone,
) -> JSONResponse:
    """The whole response (its `reply.n` choices); stops the decode if the client disconnects.
    A model server failing after the first event raises ApiError 503 (`stream_failure`)."""
    parts: dict[int, list[str]] = {i: [] for i in range(reply.n)}
    logprobs: dict[int, list[DecodedLogprob] | None] = dict.fromkeys(range(reply.n))
    dones: dict[int, Done] = {}
    event = first
    while True:
        if isinstance(event, Done):
            dones[event.index] = event
            if len(dones) == reply.n:
                break
        else:
            reply.took(event)
            parts[event.index].append(event.text)
            if event.logprobs is not None:
                logprobs[event.index] = (logprobs[event.index] or []) + event.logprobs
            if await http.is_disconnected():
                await events.aclose()
                raise asyncio.CancelledError("client disconnected")
        try:
            event = await anext(events)
        except Exception as err:  # noqa: BLE001 - any failure of the model server: a 503 body
            raise stream_failure(err, reply.request_id) from None
    done = merged(dones)
    on_done(reply, done)
    choices = [
        reply.choice("".join(parts[i]), dones[i].finish_reason, logprobs[i], i)
        for i in range(reply.n)
    ]
    return JSONResponse(reply.whole(choices, done.usage, done.specserve).model_dump())


def merged(dones: dict[int, Done]) -> Done:
    """One request's end over its choices, as OpenAI counts usage: the prompt once, every
    choice's completion tokens; how it was served: choice 0's."""
    first = dones[0]
    completion = sum(d.usage.completion_tokens for d in dones.values())
    usage = Usage(
        prompt_tokens=first.usage.prompt_tokens,
        completion_tokens=completion,
        total_tokens=first.usage.prompt_tokens + completion,
    )
    return first.model_copy(update={"usage": usage})


async def sse(
    reply: Reply,
    first: Delta | Done,
    events: AsyncIterator[Delta | Done],
    include_usage: bool,
    on_done: OnDone,
    on_close: Callable[[], None],
    on_error: OnStreamError | None = None,
) -> AsyncIterator[str]:
    """The response as server-sent events, ending `data: [DONE]`; `on_close` runs when the
    stream ends, however it ends (the events are closed with it). A model server failing
    mid-stream ends it with one OpenAI error event, then `[DONE]`, told to `on_error`."""
    try:
        if reply.endpoint == "chat":
            role = ChatDelta(role="assistant", content="")
            for i in range(reply.n):
                yield _data(reply.chunk([ChatChunkChoice(index=i, delta=role, finish_reason=None)]))
        event, dones = first, {}
        try:
            while True:
                if isinstance(event, Done):  # this choice's last chunk
                    dones[event.index] = event
                    final = reply.chunk_choice("", event.finish_reason, index=event.index)
                    yield _data(reply.chunk([final], specserve=event.specserve))
                    if len(dones) == reply.n:
                        break
                else:
                    reply.took(event)
                    choice = reply.chunk_choice(event.text, None, event.logprobs, event.index)
                    yield _data(reply.chunk([choice]))
                event = await anext(events)
        except Exception as err:  # noqa: BLE001 - the replica died or failed: still an end event
            failure = stream_failure(err, reply.request_id)
            if on_error is not None:
                on_error(reply.endpoint, failure.code)
            yield _data(failure.body(reply.request_id))
            yield "data: [DONE]\n\n"
            return
        done = merged(dones)
        on_done(reply, done)
        if include_usage:
            yield _data(reply.chunk([], usage=done.usage))
        yield "data: [DONE]\n\n"
    finally:
        on_close()
        await events.aclose()


def _data(body: BaseModel | dict) -> str:
    obj = body.model_dump() if isinstance(body, BaseModel) else body
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
