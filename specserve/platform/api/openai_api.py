"""OpenAI-compatible request bodies and error shapes: requests are strict (unknown fields,
unsupported values, bad types: a 400 naming the field, as OpenAI's API does); `ApiError` is an
OpenAI error body, `registry_unavailable` and `internal_error` the ones any route may answer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ApiError(Exception):
    """An error response: HTTP status + {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers or {}

    def body(self) -> dict:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorBody(error=detail).model_dump()


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """An OpenAI error response body."""

    error: ErrorDetail


REGISTRY_RETRY_AFTER_S = 2
RETRY_LATER = {
    503: {
        "model": ErrorBody,
        "description": "`registry_unavailable` (the variant registry's store is down) or, on a "
        "model request, `overloaded`: retry after `Retry-After` seconds",
        "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    }
}  # the OpenAPI `responses` of a route that may answer 503


def registry_unavailable() -> ApiError:
    """503 `registry_unavailable`: the variant registry's store cannot be read or written now."""
    return ApiError(
        503,
        "the variant registry is unreachable; retry shortly",
        "server_error",
        code="registry_unavailable",
        headers={"Retry-After": str(REGISTRY_RETRY_AFTER_S)},
    )


def internal_error() -> ApiError:
    """500 `internal_error` for an unexpected exception: a short message, the detail is logged."""
    return ApiError(
        500,
        "internal server error; the details are in the server log",
        "server_error",
        code="internal_error",
    )


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    """Sampling fields shared by both endpoints (OpenAI defaults; top_k and ignore_eos as in vLLM)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: up to 4 non-empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        if v:
            raise ValueError(
                "logit_bias is not supported (it would change the target distribution)"
            )
        return v


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: None = None
    best_of: Literal[1] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("prompt: exactly one prompt per request")
            v = v[0]
        if not v:
            raise ValueError("prompt: must not be empty")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Literal[False] = False
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _one_limit(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError("max_tokens and max_completion_tokens disagree")
            self.max_tokens = self.max_completion_tokens
        return self

    def chat(self) -> list[dict[str, str]]:
        role = {"developer": "system"}
        return [{"role": role.get(m.role, m.role), "content": m.text()} for m in self.messages]


def validation_error(err) -> ApiError:
    """A pydantic ValidationError as a 400 naming the first offending field."""
    first = err.errors()[0]
    param = (
        ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith("function-")) or None
    )
    kind = "unknown_field" if first.get("type") == "extra_forbidden" else "invalid_value"
    return ApiError(
        400,
        f"{param}: {first.get('msg')}" if param else first.get("msg", "invalid"),
        param=param,
        code=kind,
    )
