"""OpenAI-compatible request bodies: strict (unknown fields, unsupported values, bad types: a 400
naming the field, errors.py's `validation_error`). The sampling fields reuse the engine's rules
(engine/sampling.py); `to_sampling()` is the engine's view of a request.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from specserve.engine.sampling import (
    ChoiceCount,
    LogitBias,
    Penalty,
    SamplingParams,
    Temperature,
    TokenCount,
    TopK,
    TopLogprobs,
    TopP,
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = Field(
        False,
        description="vLLM's, sent by load clients (guidellm): accepted, and the usage still "
        "comes once, in the chunk before `[DONE]` when `include_usage` is set; no chunk "
        "before it carries one (the prompt's token count is known only at the end)",
    )


_LOGIT_BIAS = TypeAdapter(LogitBias)


def _token_bias(value: object) -> object:
    """`logit_bias` as JSON sends it (token ids as digit strings) -> the engine's `LogitBias`,
    checked as a whole so that an error names `logit_bias` rather than one of its keys."""
    if not isinstance(value, dict):
        return value
    if not all(isinstance(token, str) and token.isdigit() for token in value):
        raise ValueError("logit_bias: token ids are digit strings")
    try:
        return _LOGIT_BIAS.validate_python({int(token): bias for token, bias in value.items()})
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f" token {part}:" for part in first["loc"] if isinstance(part, int))
        raise ValueError(f"logit_bias:{where} {first['msg']}") from None


OpenAITemperature = Annotated[Temperature, Field(le=2.0)]  # OpenAI's range within the engine's
CompletionTopLogprobs = Annotated[TopLogprobs, Field(le=5)]  # the legacy endpoint's limit


class _Common(BaseModel):
    """Sampling fields shared by both endpoints (OpenAI defaults; top_k and ignore_eos as in
    vLLM; `speculation` is specserve's own, checked against the variant by `GenerateRequest`)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: TokenCount | None = None
    temperature: OpenAITemperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    n: ChoiceCount = 1  # usage counts the prompt once
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: Annotated[LogitBias | None, BeforeValidator(_token_bias)] = None
    ignore_eos: bool = False
    speculation: str | None = Field(
        None,
        description="specserve's: `off` (plain `ar`, no draft) or a strategy name (`ar`, "
        "`prompt_lookup`, `lookahead`; `medusa` / `eagle` where the variant has a trained "
        "drafter); anything else is a 400 listing the valid values. Lossless: only speed "
        "differs. Absent: the policy decides.",
        examples=["off", "lookahead"],
    )

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: up to 4 non-empty strings")
        return stops

    def logprobs_count(self) -> int | None:
        """The top candidates to report per token; None: no logprobs."""
        raise NotImplementedError

    def to_sampling(self, default_max_tokens: int) -> SamplingParams:
        """The engine's settings for this request: every field `SamplingParams` names alike
        (temperature, penalties, logit_bias...), then `max_tokens` (`default_max_tokens` where the
        request sets none) and the logprobs asked for."""
        same = self.model_dump(include=_SAME_NAMED, exclude_none=True)
        limit = self.max_tokens or default_max_tokens
        return SamplingParams(**same, max_new_tokens=limit, logprobs=self.logprobs_count())


_SAME_NAMED = SamplingParams.model_fields.keys() & _Common.model_fields.keys()


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: CompletionTopLogprobs | None = None
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

    def logprobs_count(self) -> int | None:
        """The top candidates to report per token; None: no logprobs."""
        return self.logprobs


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
    logprobs: bool | None = False
    top_logprobs: TopLogprobs | None = None
    response_format: ResponseFormat | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v, info):
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs: true")
        return v

    def logprobs_count(self) -> int | None:
        """The top candidates to report per token; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages")
    @classmethod
    def _some_content(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.text() for m in v):  # what the model server refuses (engine/prompts.py)
            raise ValueError("at least one message must have non-empty content")
        return v

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
