"""The events a model server streams for one request: `Delta`s of text, then one `Done`.

Across Ray they travel as `model_dump()` dicts; `parse_event` turns one back into its model (the
`type` field tells which). The gateway shapes them into OpenAI JSON (api/shaping.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopToken(_Event):
    """One candidate of a position: its text (the tokenizer's decode of the one id), id, logprob."""

    token: str
    token_id: int
    logprob: float


class DecodedLogprob(_Event):
    """The engine's `TokenLogprob` (engine/logprobs.py: a committed token's logprob under the
    distribution it was drawn from, and the position's most likely candidates, most likely first)
    with the text of each token, as the gateway reports it."""

    token: str
    token_id: int
    logprob: float
    top_logprobs: list[TopToken]


class Delta(_Event):
    """New text of the completion and the token ids it decodes from; `logprobs` (when the request
    asks): one per token id; per token, so they need not line up with the text held back for stop
    strings or incomplete characters (a delta may carry logprobs and no text yet)."""

    type: Literal["delta"] = "delta"
    text: str
    token_ids: list[int]
    index: int = Field(0, ge=0, exclude_if=lambda v: v == 0)  # the choice (n > 1)
    logprobs: list[DecodedLogprob] | None = Field(None, exclude_if=lambda v: v is None)


class Usage(_Event):
    """OpenAI's usage object."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class DoneInfo(_Event):
    """How a request was served: the `specserve` object of the final response."""

    variant: str | None  # None: the base model
    version: int | None
    strategy: str
    reason: str  # why the policy chose the strategy
    tau: float  # tokens per target forward
    load_capped_steps: int  # steps whose draft the batch's load cut
    forwards: int
    drafted_by_depth: list[int]  # steps drafting at least this position
    accepted_by_depth: list[int]  # steps accepting at least this position
    train_kind: str | None  # drafter training the policy asks for, if any
    # the drafter the policy asks to retrain from the variant's traffic (its acceptance dropped)
    retrain_kind: str | None = Field(None, exclude_if=lambda v: v is None)
    # accepted draft tokens per source (eagle / prompt / pool) where the strategy merges several
    accepted_by_source: dict[str, int] = Field({}, exclude_if=lambda v: not v)
    # the position-invariant forward served it: one output whatever the batch, strategy or pool
    invariant: bool = False
    # the decode's cost in 1-token forwards (cost curve + draft levels) and the tokens it made:
    # decode_tokens / decode_cost is its speed against `ar` (None: no cost curve on the replica)
    decode_cost: float | None = Field(None, exclude_if=lambda v: v is None)
    decode_tokens: int = Field(0, exclude_if=lambda v: v == 0)
    replica: str | None = Field(None, exclude_if=lambda v: v is None)  # set under Ray Serve


class Done(_Event):
    """The end of a request."""

    type: Literal["done"] = "done"
    finish_reason: str
    usage: Usage
    specserve: DoneInfo
    index: int = Field(0, ge=0, exclude_if=lambda v: v == 0)  # the choice (n > 1)

    def served_by(self, replica: str) -> Done:
        """This event naming the replica that served it (routing is observable)."""
        info = self.specserve.model_copy(update={"replica": replica})
        return self.model_copy(update={"specserve": info})


def decoded_logprobs(logprobs, piece: Callable[[int], str]) -> list[DecodedLogprob] | None:
    """The engine's logprobs of a step (`engine.logprobs.TokenLogprob`s) with each token's text
    `piece(token_id)`; None stays None."""
    if logprobs is None:
        return None

    def top(c) -> TopToken:
        return TopToken(token=piece(c.token_id), token_id=c.token_id, logprob=c.logprob)

    return [
        DecodedLogprob(
            token=piece(lp.token_id),
            token_id=lp.token_id,
            logprob=lp.logprob,
            top_logprobs=[top(c) for c in lp.top],
        )
        for lp in logprobs
    ]


Event = Annotated[Delta | Done, Field(discriminator="type")]
_EVENT = TypeAdapter(Event)


def parse_event(data: dict) -> Delta | Done:
    """A `model_dump()`ed event as its model; ValidationError if it is neither."""
    return _EVENT.validate_python(data)
