"""The decode loop shared by every strategy: propose -> verify -> commit -> stream.

All per-request state lives in `RequestState` (state.py); `Decoder.step` is propose + verify +
accept + commit for one request, and the scheduler (`engine/batch/scheduler.py`) uses the same
propose / accept / commit for a batch. `Decoder` serves the model it is given; `Engine`
(engine.py) first admits the model's family.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import torch
from pydantic import BaseModel

from specserve.engine import hf_internals, row_tiles
from specserve.engine.decode.state import (
    GenerationResult,
    RequestState,
    StepResult,
    Verdict,
    feature_layers,
)
from specserve.engine.forward import invariance
from specserve.engine.forward.single import ForwardOutput, verify_forward
from specserve.engine.logprobs import logprob_rows, step_logprobs
from specserve.engine.lora.batch import check_adapters
from specserve.engine.ngram_pool import NGramPool
from specserve.engine.penalties import penalized
from specserve.engine.proposers import REGISTRY, ProposerContext
from specserve.engine.sampling import SamplingParams, target_probs
from specserve.engine.seeded import seeded_accept
from specserve.engine.textstream import TextStream
from specserve.engine.tree import Draft, cap_depth, cap_draft, draft_width
from specserve.engine.verify import greedy_accept, greedy_tokens, sample_accept


class Decoder:
    """Decodes requests on one loaded model, whose family the caller has admitted (`Engine`
    admits it itself); holds no per-request state itself."""

    def __init__(
        self,
        model,
        tokenizer,
        eos_ids: frozenset[int],
        pad_width: Callable[[int], int] | None = None,
        drafters: dict[str, object] | None = None,
        invariant: bool = True,
    ) -> None:
        """`pad_width(k)`: the verify width to run k decode tokens at (the device's cheapest
        width >= k, from its cost curve); None runs exactly k. `drafters`: strategy name ->
        trained drafter checked against this model (see `engine.drafters.artifact`).
        `invariant`: serve the position-invariant forward where the probe finds this machine's
        kernels row-invariant (`invariance.apply`; `self.invariance` says what it found)."""
        self.invariance = invariance.apply(model, enabled=invariant)
        self.tiled = getattr(model, "row_plan", None) is not None  # prompt tiles need alignment
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.pad_width = pad_width
        self.drafters = dict(drafters or {})

    @classmethod
    def from_loaded(
        cls, loaded, pad_width: Callable[[int], int] | None = None, drafters=None
    ) -> Decoder:
        return cls(loaded.model, loaded.tokenizer, loaded.eos_token_ids, pad_width, drafters)

    def start(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        strategy: str = "ar",
        config: BaseModel | dict | None = None,
        pool: NGramPool | None = None,
        adapter: str | None = None,
        drafter=None,
    ) -> RequestState:
        """`adapter`: a LoRA adapter resident on the model (its LoRAStore or peft wrapper; None = the model's default,
        `lora.BASE_ADAPTER` = the base alone); `pool`: the n-gram pool of that variant@version;
        `drafter`: the trained drafter of this request's variant (default: the engine's own)."""
        params = params or SamplingParams()
        check_adapters(self.model, [adapter])  # fail now, not mid-stream, on an unknown adapter
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit and len(prompt_ids) + params.max_new_tokens > limit:
            raise ValueError(
                f"prompt: {len(prompt_ids)} tokens + max_new_tokens {params.max_new_tokens} "
                f"exceed the model's context of {limit} positions"
            )
        vocab = self.model.config.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias: token ids must be below the vocabulary size {vocab}")
        cfg = REGISTRY.config(strategy, config)
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**31)
        ctx = ProposerContext(
            list(prompt_ids),
            self.model.config.vocab_size,
            seed,
            pool,
            drafter=drafter
            if drafter is not None
            else self.drafters.get(REGISTRY.get(strategy).drafts_with),
        )
        generator = torch.Generator().manual_seed(seed)
        return RequestState(
            params=params,
            strategy=strategy,
            proposer=REGISTRY.get(strategy).build(cfg, ctx),
            prompt_len=len(prompt_ids),
            tokens=list(prompt_ids),
            pending=list(prompt_ids),
            # the invariant forward is eager: its cache appends in place
            cache=hf_internals.new_cache(self.model.config, growing=self.invariance.invariant),
            generator=generator,
            seed=seed,
            text=TextStream(self.tokenizer, params.stop),
            eos_ids=frozenset() if params.ignore_eos else self.eos_ids,
            adapter=adapter,
        )

    def step(self, state: RequestState) -> StepResult:
        """One target forward: propose a draft, verify it, commit the accepted path + bonus."""
        draft = self.propose(state)
        proposed = time.perf_counter()
        past = hf_internals.cache_length(state.cache)
        width = len(state.pending) + draft_width(draft)
        pad_to = self.pad_width(width) if self.pad_width and len(state.pending) == 1 else 0
        aligned = row_tiles.aligned_rows(past, len(state.pending) - 1) if self.tiled else 0
        out = verify_forward(
            self.model,
            state.cache,
            past,
            state.pending,
            draft,
            pad_to,
            feature_layers(state),
            state.adapter,
            aligned,
        )
        verdict = self.accept(state, draft, out)  # reads the rows: a device sync point
        if len(state.pending) == 1:
            state.verify_seconds += time.perf_counter() - proposed
        hf_internals.keep_rows(state.cache, past + len(state.pending), verdict.accepted)
        return self.commit(state, draft, out, verdict)

    def prefill_chunk(self, state: RequestState, size: int) -> None:
        """Feed the first `size` pending prompt tokens into the cache and commit nothing (chunked
        prefill); the last chunk goes through `step`, which also verifies the first draft."""
        if not 0 < size < len(state.pending):
            raise ValueError(f"prefill chunk {size}: must be in 1..{len(state.pending) - 1}")
        past = hf_internals.cache_length(state.cache)
        layers = feature_layers(state)
        aligned = row_tiles.aligned_rows(past, size) if self.tiled else 0
        prompt = state.pending[:size]
        out = verify_forward(
            self.model, state.cache, past, prompt, Draft(), 0, layers, state.adapter, aligned
        )
        if out.features is not None:
            state.prefill_features.append(out.features[:size])
        state.pending = state.pending[size:]

    @property
    def min_prefill(self) -> int:
        """The fewest prompt tokens a prefill step should offer a request: one aligned block
        on a row-tiled model (chunks never cut one, `prefill_size`), else 1."""
        return row_tiles.BLOCK_TILE if self.tiled else 1

    def prefill_size(self, state: RequestState, budget: int) -> int:
        """The prefill chunk to run within `budget` tokens (< the pending prompt): all of it, or
        on a row-tiled model the part ending on a tile boundary (0: wait for a larger budget),
        so every prompt token sits in the same tile whatever the chunking."""
        if not self.tiled:
            return budget
        past = hf_internals.cache_length(state.cache)
        return row_tiles.aligned_chunk(past, budget, past + len(state.pending) - 1)

    def propose(self, state: RequestState, max_draft: int | None = None) -> Draft:
        """The proposer's draft, cut to `max_draft` tokens (None: uncut; 0: no draft) and, on
        the position-invariant forward, to what its attention takes (`hf_internals.DEPTH`)."""
        started = time.perf_counter()
        draft = state.proposer.propose(state.tokens)
        if len(state.pending) == 1:
            state.draft_seconds += time.perf_counter() - started
        if self.invariance.invariant:
            draft = cap_depth(draft, hf_internals.DEPTH)
        return draft if max_draft is None else cap_draft(draft, max_draft)

    @staticmethod
    def row_logits(state: RequestState, draft: Draft, out: ForwardOutput) -> torch.Tensor:
        """The target's logits at every verify row [n + 1, vocab] as the verifier reads them
        (the root row, then node i's row i + 1), penalties and logit_bias applied per row."""
        if not state.params.penalized:  # the common case: no prefix to count
            return out.tree_logits
        return penalized(out.tree_logits, draft.tree, state.output_ids, state.params)

    @staticmethod
    def accept(state: RequestState, draft: Draft, out: ForwardOutput) -> Verdict:
        """The verifier: accepted draft nodes and the bonus token, from one reading of the rows.
        Greedy: the argmax; sampled: the position-keyed sample (seeded.py: reproducible,
        lossless); a draft carrying its own distribution q: recursive rejection sampling
        (lossless, not reproducible). With the request's `logprobs`, those of the committed
        tokens, from the same distribution (engine/logprobs.py)."""
        params, tree = state.params, draft.tree
        rows = Decoder.row_logits(state, draft, out)  # [n + 1, vocab]
        if params.greedy:
            accepted, bonus = greedy_accept(tree, greedy_tokens(rows))
            log_rows = None if params.logprobs is None else logprob_rows(rows, params)
        else:
            probs = target_probs(rows, params).cpu()
            if tree.draft_probs is None:
                accepted, bonus = seeded_accept(tree, probs, state.seed, len(state.tokens))
            else:
                accepted, bonus = sample_accept(tree, probs, state.generator)
            log_rows = None if params.logprobs is None else torch.log(probs)
        if log_rows is None:
            return Verdict(accepted, bonus)
        tokens = [tree.tokens[i] for i in accepted] + [bonus]
        return Verdict(accepted, bonus, step_logprobs(log_rows, accepted, tokens, params.logprobs))

    def commit(
        self,
        state: RequestState,
        draft: Draft,
        out: ForwardOutput,
        verdict: Verdict,
    ) -> StepResult:
        """Append the accepted path + bonus, update counters, feed the proposer, stream text.
        The caller has already kept the KV entries of the pending rows and the accepted nodes."""
        state.forwards += 1
        pending = len(state.pending)
        if pending == 1:
            state.widths.append(pending + draft_width(draft))
        _count(state.drafted_by_depth, max(draft.tree.depths, default=0))
        accepted = verdict.accepted
        _count(state.accepted_by_depth, len(accepted))
        new_ids = self._commit(state, [draft.tree.tokens[i] for i in accepted] + [verdict.bonus])
        observing = time.perf_counter()
        state.proposer.observe(draft, out.aux_tokens, state.tokens)
        if out.features is not None and not state.done:
            # rows whose next token is now committed: every pending row, then the accepted nodes
            rows = list(range(pending)) + [pending + i for i in accepted[: len(new_ids) - 1]]
            features = out.features[rows]
            if state.prefill_features:  # a chunked prefill: the earlier chunks' features first
                features = torch.cat([*state.prefill_features, features])
                state.prefill_features = []
            state.proposer.observe_features(features, state.tokens)
        if pending == 1:
            state.draft_seconds += time.perf_counter() - observing
        logprobs = verdict.logprobs
        logprobs = logprobs[: len(new_ids)] if logprobs is not None else None  # cut by EOS / limit
        return StepResult(new_ids, self._stream_text(state, new_ids), logprobs)

    def _commit(self, state: RequestState, new_ids: list[int]) -> list[int]:
        """Append up to the first EOS / max_new_tokens; the last token becomes pending."""
        room = state.params.max_new_tokens - len(state.output_ids)
        new_ids = new_ids[:room]
        eos_at = next((i for i, t in enumerate(new_ids) if t in state.eos_ids), None)
        if eos_at is not None:
            new_ids = new_ids[: eos_at + 1]
            state.finish_reason = "stop"
        elif len(new_ids) == room:
            state.finish_reason = "length"
        state.tokens.extend(new_ids)
        state.pending = [new_ids[-1]]
        if state.first_token_at is None:
            state.first_token_at = time.perf_counter()
        return new_ids

    def _stream_text(self, state: RequestState, new_ids: list[int]) -> str:
        text_ids = [t for t in new_ids if t not in state.eos_ids]
        delta = state.text.push(text_ids)
        if state.text.stopped:
            state.finish_reason = "stop"
        elif state.done:
            delta += state.text.finish()
        return delta

    def stream(self, state: RequestState) -> Iterator[StepResult]:
        while not state.done:
            yield self.step(state)

    def generate(self, *args, **kwargs) -> GenerationResult:
        """One request to its end: `start`'s arguments, then every step."""
        state = self.start(*args, **kwargs)
        for _ in self.stream(state):
            pass
        return self.result(state)

    @staticmethod
    def result(state: RequestState) -> GenerationResult:
        end = time.perf_counter()
        return GenerationResult(
            prompt_ids=state.tokens[: state.prompt_len],
            output_ids=state.output_ids,
            text=state.text.text,
            finish_reason=state.finish_reason or "length",
            strategy=state.strategy,
            forwards=state.forwards,
            tau=state.tau,
            widths=list(state.widths),
            seconds=end - state.started_at,
            ttft_seconds=(state.first_token_at or end) - state.started_at,
            drafted_by_depth=list(state.drafted_by_depth),
            accepted_by_depth=list(state.accepted_by_depth),
            accepted_by_source=dict(getattr(state.proposer, "accepted_by_source", {})),
            draft_seconds=state.draft_seconds,
            verify_seconds=state.verify_seconds,
        )


def _count(by_depth: list[int], depth: int) -> None:
    """Add one step reaching `depth` to per-depth counters. Example: [3, 1] + depth 3 -> [4, 2, 1]."""
    by_depth.extend([0] * (depth - len(by_depth)))
    for d in range(depth):
        by_depth[d] += 1
