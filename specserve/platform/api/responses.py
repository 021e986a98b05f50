"""The OpenAI response bodies the gateway sends: chat and text completions, whole or as stream
chunks, with their logprobs objects. `model_dump()` is the JSON body; keys OpenAI leaves out stay
absent (a chat choice's `logprobs` unless asked; `specserve` but on a choice's last chunk, `usage`
but on the chunk before `[DONE]`), a text choice's `logprobs` is null unless asked.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from specserve.platform.events import DecodedLogprob, DoneInfo, TopToken, Usage

LOGPROB_FLOOR = -9999.0  # OpenAI's stand-in for a log-probability too small to represent


def floored(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)  # JSON has no -inf


def _absent() -> Any:
    """A field left out of the body while it is None."""
    return Field(None, exclude_if=lambda v: v is None)


def _token(lp: TopToken | DecodedLogprob) -> dict[str, Any]:
    """{token, logprob, bytes} of a token or candidate: `bytes` are its text's UTF-8 bytes."""
    return {"token": lp.token, "logprob": floored(lp.logprob), "bytes": list(lp.token.encode())}


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]  # the token text's UTF-8 bytes


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(BaseModel):
    """Chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    content: list[ChatTokenLogprob]

    @classmethod
    def of(cls, logprobs: list[DecodedLogprob]) -> ChatLogprobs:
        content = [
            ChatTokenLogprob(
                **_token(lp), top_logprobs=[ChatTopLogprob(**_token(c)) for c in lp.top_logprobs]
            )
            for lp in logprobs
        ]
        return cls(content=content)


class CompletionLogprobs(BaseModel):
    """The legacy completions object: tokens, token_logprobs, top_logprobs (the top candidates
    and the chosen token, text -> logprob), text_offset (into the completion text)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, logprobs: list[DecodedLogprob], start: int) -> CompletionLogprobs:
        """`start`: the text offset of the first token (the token texts before it, counted)."""
        offsets = []
        for lp in logprobs:
            offsets.append(start)
            start += len(lp.token)
        return cls(
            tokens=[lp.token for lp in logprobs],
            token_logprobs=[floored(lp.logprob) for lp in logprobs],
            top_logprobs=[_top_by_text(lp) for lp in logprobs],
            text_offset=offsets,
        )


def _top_by_text(lp: DecodedLogprob) -> dict[str, float]:
    """text -> logprob of the top candidates, most likely first, then the chosen token if it is
    not among them (a text two ids decode to keeps the likelier)."""
    out: dict[str, float] = {}
    for c in [*lp.top_logprobs, lp]:
        out.setdefault(c.token, floored(c.logprob))
    return out


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatDelta(BaseModel):
    """What a chat chunk adds: the role (first chunk), text, or nothing (a choice's last)."""

    role: Literal["assistant"] | None = _absent()
    content: str | None = _absent()


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChatLogprobs | None = _absent()


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None
    logprobs: ChatLogprobs | None = _absent()


class CompletionChoice(BaseModel):
    """A text completion's choice, whole or in a chunk (`finish_reason` null until its last)."""

    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None


class _Response(BaseModel):
    id: str
    object: str
    created: int  # unix seconds
    model: str  # as the request named it


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    specserve: DoneInfo


class TextCompletion(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage
    specserve: DoneInfo


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    specserve: DoneInfo | None = _absent()  # on a choice's last chunk
    usage: Usage | None = _absent()  # on the chunk before [DONE], when the request asks


class TextCompletionChunk(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    specserve: DoneInfo | None = _absent()  # on a choice's last chunk
    usage: Usage | None = _absent()  # on the chunk before [DONE], when the request asks


Choice = ChatChoice | CompletionChoice
ChunkChoice = ChatChunkChoice | CompletionChoice
Completion = ChatCompletion | TextCompletion
Chunk = ChatCompletionChunk | TextCompletionChunk
