"""Sampling parameters, the one definition of each sampling rule (`Penalty`, `LogitBias`,
`ChoiceCount`...: annotated types the OpenAI request models reuse), and the pure map from target
logits to the distribution we sample from. Temperature 0 means greedy. The same processed
distribution is used for plain sampling and for lossless speculative acceptance, so speculation
reproduces exactly this distribution.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import BaseModel, ConfigDict, Field

MAX_CHOICES = 16  # n per request (each choice is a batch row, sharing one prefill)
MAX_BIASED_TOKENS = 300

TokenCount = Annotated[int, Field(ge=1)]  # tokens to generate
Temperature = Annotated[float, Field(ge=0.0, description="0: greedy")]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=0, description="0 disables top-k")]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]  # presence / frequency, as OpenAI's
TokenId = Annotated[int, Field(ge=0)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]
LogitBias = Annotated[
    dict[TokenId, Bias],
    Field(max_length=MAX_BIASED_TOKENS, description="token id -> bias added to its logit"),
]
TopLogprobs = Annotated[int, Field(ge=0, le=20, description="top candidates reported per token")]
ChoiceCount = Annotated[
    int, Field(ge=1, le=MAX_CHOICES, description="choices, sharing one prefill")
]


class SamplingParams(BaseModel):
    """Per-request decoding settings; invalid values fail naming the field."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: TokenCount = 128
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: LogitBias = Field(default_factory=dict)
    logprobs: TopLogprobs | None = Field(
        None, description="report logprobs + this many top candidates per token"
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether penalties or biases change the model's logits (engine/penalties.py)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits [n, vocab] into probabilities after temperature, top-k and top-p.

    Example: logits [[2, 1, 0, -9]] with temperature 1, top_k 2 keeps tokens 0 and 1 with
    probabilities e/(e+1) ≈ 0.731 and 1/(e+1) ≈ 0.269. With top_p 0.7 instead, token 0 alone
    holds 0.665 < 0.7, so token 1 is kept too (same result); top_p 0.6 keeps token 0 alone.
    """
    scores = logits.float() / max(params.temperature, 1e-6)  # [n, vocab]
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [n, vocab]
        drop_sorted = mass_before >= params.top_p  # keeps the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)
