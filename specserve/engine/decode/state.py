"""What one request in flight is (`RequestState`: tokens, KV cache, proposer, random generator,
text stream, counters) and what a decode step and a finished request report (`StepResult`,
`Verdict`, `GenerationResult`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specserve.engine.logprobs import TokenLogprob
from specserve.engine.proposers.base import Proposer
from specserve.engine.sampling import SamplingParams
from specserve.engine.textstream import TextStream


@dataclass
class RequestState:
    """One request in flight. `tokens` = prompt + committed output; `pending` = committed tokens
    not yet in the KV cache (the whole prompt before the first step, then the bonus token)."""

    params: SamplingParams
    strategy: str
    proposer: Proposer
    prompt_len: int
    tokens: list[int]
    pending: list[int]
    cache: object
    generator: torch.Generator
    seed: int  # the request's seed, or a random one: sampled tokens are keyed by it (seeded.py)
    text: TextStream
    eos_ids: frozenset[int]
    adapter: str | None = None  # resident LoRA adapter name; None = the base model
    forwards: int = 0
    widths: list[int] = field(default_factory=list)  # tokens scored by each decode step
    drafted_by_depth: list[int] = field(default_factory=list)  # [d]: steps drafting depth >= d+1
    accepted_by_depth: list[int] = field(default_factory=list)  # [d]: steps accepting >= d+1
    finish_reason: str | None = None
    prefill_features: list = field(default_factory=list)  # [m, L, H] per prefill chunk so far
    capped_steps: int = 0  # decode steps whose draft the batch's load cut
    # decode steps only (one pending token): seconds in the proposer (propose + observe, on
    # every path), and in the target's verify forward + acceptance (`Decoder.step` only: a
    # batched forward's time is shared by its rows)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    started_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def tau(self) -> float:
        """Committed tokens per target forward."""
        return len(self.output_ids) / self.forwards if self.forwards else 0.0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class StepResult:
    new_ids: list[int]  # committed this step
    text: str  # text delta safe to stream
    logprobs: list[TokenLogprob] | None = None  # one per new_ids token, when the request asks


@dataclass(frozen=True)
class Verdict:
    """The verifier's decision for one step: accepted draft nodes (root to leaf), the bonus
    token, and the committed tokens' logprobs when the request asks (else None)."""

    accepted: list[int]
    bonus: int
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    finish_reason: str
    strategy: str
    forwards: int
    tau: float
    widths: list[int]  # tokens scored by each decode step (root + draft + aux; prefill excluded)
    seconds: float
    ttft_seconds: float
    drafted_by_depth: list[int] = field(default_factory=list)  # [d]: steps drafting depth >= d+1
    accepted_by_depth: list[int] = field(default_factory=list)  # [d]: steps accepting >= d+1
    # accepted draft tokens per source, for proposers that merge several (e.g. hybrid)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0  # decode steps: in the proposer (RequestState.draft_seconds)
    verify_seconds: float = 0.0  # decode steps: verify forward + acceptance


def feature_layers(state: RequestState) -> tuple[int, ...]:
    """The target layers whose hidden features this request's proposer drafts from."""
    return tuple(getattr(state.proposer, "feature_layers", ()))
