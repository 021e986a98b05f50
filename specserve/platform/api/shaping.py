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

from specserve.platform.api.drain import ShuttingDown, shutting_down_error
from specserve.platform.api.openai_api import ApiError
from specserve.platform.events import Delta, Done, DecodedLogprob, Usage
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
    """Per-response bookkeeping: ids, timing of tokens; the OpenAI envelope and choices."""

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

    def envelope(self, choices: list, whole: bool = False) -> dict:
        """The response object around `choices`: a whole response, else a stream chunk."""
        obj = {"chat": "chat.completion", "completions": "text_completion"}[self.endpoint]
        if not whole and self.endpoint == "chat":
            obj = "chat.completion.chunk"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk_choice(
        self,
        text: str,
        finish_reason: str | None,
        logprobs: list[DecodedLogprob] | None = None,
        index: int = 0,
    ) -> dict:
        """A stream chunk's choice; `logprobs`: those of the delta's tokens (when asked)."""
        if self.endpoint == "chat":
            delta = {"content": text} if text else {}
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
            return choice | self._chat_logprobs(logprobs)
        shaped = self._completion_logprobs(logprobs, index)
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": shaped}

    def choice(
        self,
        text: str,
        finish_reason: str,
        logprobs: list[DecodedLogprob] | None = None,
        index: int = 0,
    ) -> dict:
        """The whole response's choice; `logprobs`: every completion token's (when asked)."""
        if self.endpoint == "chat":
            message = {"role": "assistant", "content": text}
            choice = {"index": index, "message": message, "finish_reason": finish_reason}
            return choice | self._chat_logprobs(logprobs)
        shaped = self._completion_logprobs(logprobs, index)
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": shaped}

    @staticmethod
    def _chat_logprobs(logprobs: list[DecodedLogprob] | None) -> dict:
        """Chat's `logprobs` entry: {"content": [{token, logprob, bytes, top_logprobs}]}; no
        entry unless asked (the shape stays as before)."""
        if logprobs is None:
            return {}
        content = [
            _token(lp) | {"top_logprobs": [_token(c) for c in lp.top_logprobs]} for lp in logprobs
        ]
        return {"logprobs": {"content": content}}

    def _completion_logprobs(
        self, logprobs: list[DecodedLogprob] | None, index: int = 0
    ) -> dict | None:
        """The legacy completions object: tokens, token_logprobs, top_logprobs (the top candidates
        and the chosen token, text -> logprob), text_offset (into the completion text, counted
        over the token texts so far; a stream continues the count)."""
        if logprobs is None:
            return None
        offsets = []
        for lp in logprobs:
            offsets.append(self.text_offsets.get(index, 0))
            self.text_offsets[index] = offsets[-1] + len(lp.token)
        tops = [_top_by_text(lp) for lp in logprobs]
        return {
            "tokens": [lp.token for lp in logprobs],
            "token_logprobs": [_logprob(lp.logprob) for lp in logprobs],
            "top_logprobs": tops,
            "text_offset": offsets,
        }


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
    body = reply.envelope(choices, whole=True)
    return JSONResponse(
        body | {"usage": done.usage.model_dump(), "specserve": done.specserve.model_dump()}
    )


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
            role = {"role": "assistant", "content": ""}
            for i in range(reply.n):
                yield _data(reply.envelope([{"index": i, "delta": role, "finish_reason": None}]))
        event, dones = first, {}
        try:
            while True:
                if isinstance(event, Done):  # this choice's last chunk
                    dones[event.index] = event
                    final = reply.chunk_choice("", event.finish_reason, index=event.index)
                    info = {"specserve": event.specserve.model_dump()}
                    yield _data(reply.envelope([final]) | info)
                    if len(dones) == reply.n:
                        break
                else:
                    reply.took(event)
                    choice = reply.chunk_choice(event.text, None, event.logprobs, event.index)
                    yield _data(reply.envelope([choice]))
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
            yield _data(reply.envelope([]) | {"usage": done.usage.model_dump()})
        yield "data: [DONE]\n\n"
    finally:
        on_close()
        await events.aclose()


LOGPROB_FLOOR = -9999.0  # OpenAI's stand-in for a log-probability too small to represent


def _logprob(value: float) -> float:
    return max(value, LOGPROB_FLOOR)  # JSON has no -inf


def _top_by_text(lp: DecodedLogprob) -> dict[str, float]:
    """text -> logprob of the top candidates, most likely first, then the chosen token if it is
    not among them (a text two ids decode to keeps the likelier)."""
    out: dict[str, float] = {}
    for c in [*lp.top_logprobs, lp]:
        out.setdefault(c.token, _logprob(c.logprob))
    return out


def _token(lp) -> dict:
    """{token, logprob, bytes} of a token or candidate: `bytes` are its text's UTF-8 bytes."""
    return {"token": lp.token, "logprob": _logprob(lp.logprob), "bytes": list(lp.token.encode())}


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
