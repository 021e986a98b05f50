"""One base model's serving core, independent of Ray: variants, policy, engine, streamed events.

`ModelService.generate(request)` picks the strategy (the request's own `speculation`, else the
policy), makes the variant's adapter resident, decodes with its n-gram pool, and yields `Delta`
events then one `Done` (platform/events.py).
All requests of a replica decode together in one engine loop (`engine.batch.scheduler`, on its own
thread): each step is one forward over every admitted request, whatever its variant or strategy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from specserve.adapters.resident import PreparedAdapter, ResidentAdapters
from specserve.adapters.variants import PoolBook, VariantKey
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.batch.tickets import EngineDead, QueueFull
from specserve.engine.decode.engine import Engine
from specserve.engine.decode.state import RequestState
from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.prompts import encode_messages, encode_prompt
from specserve.engine.proposers import REGISTRY
from specserve.engine.sampling import SamplingParams
from specserve.platform.events import Delta, Done, DoneInfo, Usage, decoded_logprobs
from specserve.platform.speed import request_cost
from specserve.policies.router import (
    Decision,
    VariantView,
    decide,
    requestable,
    usable_drafters,
)
from specserve.policies.settings import PolicySettings


class Overloaded(Exception):
    """The model server cannot take the request now (queue full); the gateway answers 503."""


class ReplicaLost(Exception):
    """The model server holding a request died or became unreachable mid-request (raised by a
    backend; the gateway ends the response with an error, or retries one that has not started)."""


MAX_CHOICES = 16  # n per request (each choice is a batch row)
SPECULATION_ALIASES = {"off": "ar"}  # a request's `speculation` value -> the strategy it names


def speculation_values(view: VariantView) -> list[str]:
    """What a request's `speculation` may say on this variant now: the aliases ("off"), then
    each strategy it may use (a trained drafter's only once the variant has a usable one)."""
    return [*SPECULATION_ALIASES, *requestable(view, REGISTRY.names())]


class ServiceHealth(BaseModel):
    """Whether the engine loop serves: ok, else why not (a health check raises with it)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reason: str = ""


class Target(VariantView):
    """What the gateway resolved a `model` name to: the policy's view of the variant version
    (name None = the base model itself), where its adapter is, and the policy settings an admin
    stored (None: the server's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adapter_path: str | None = None
    adapter_sha256: str | None = None
    policy: PolicySettings | None = None
    broken: str | None = None  # why this version may not be served (the gateway refuses it)
    capture: bool = False  # the gateway keeps a sample of this variant's traffic (admin's choice)

    @property
    def key(self) -> VariantKey | None:
        return VariantKey(self.name, self.version) if self.name else None


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Target
    prompt: str | None = None  # a completion: raw text
    messages: list[dict[str, str]] | None = None  # a chat: through the chat template
    params: SamplingParams
    strategy: str | None = Field(None, description="bypass the policy (tests, benchmarks)")
    speculation: str | None = Field(
        None,
        description="the strategy the client asked for, one of `speculation_values(target)` "
        "(`off`: plain ar); None: the policy decides",
    )
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices, sharing one prefill")

    @field_validator("speculation")
    @classmethod
    def _allowed(cls, value: str | None, info: ValidationInfo) -> str | None:
        target = info.data.get("target")
        if value is None or target is None:  # no target: its own error is reported
            return value
        valid = speculation_values(target)
        if value in valid:
            return value
        if value in REGISTRY.names():  # only a drafter's strategy waits for its drafter
            why = f"needs a trained {value} drafter, and this model has no usable one now"
        else:
            why = "is unknown"
        message = f"{value[:40]!r} {why}; valid values: {', '.join(valid)}"
        raise PydanticCustomError("invalid_speculation", "{message}", {"message": message})

    @property
    def requested_strategy(self) -> str | None:
        """The strategy `speculation` names (None: not asked)."""
        return SPECULATION_ALIASES.get(self.speculation, self.speculation)

    @property
    def load_aware(self) -> bool:
        """Whether the replica may cut this request's drafts under load: not when the caller set
        `strategy` or an admin forced one the request did not override (a request's own
        `speculation` is cut like the policy's choice)."""
        if self.strategy:
            return False
        return self.speculation is not None or not self.target.forced_strategy

    def choice_params(self, index: int, base_seed: int) -> SamplingParams:
        """Choice `index`'s sampling: seed `base_seed + index`, so choice i answers what a single
        request with that seed answers (choice 0: the request's own seed)."""
        return self.params.model_copy(update={"seed": base_seed + index})


class ModelService:
    """Serves every variant of one loaded base model."""

    def __init__(
        self,
        loaded,
        adapters: ResidentAdapters,
        pools: PoolBook,
        policy: PolicySettings,
        strategy_configs: dict[str, BaseModel] | None = None,
        pad_width: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.time,
        curve=None,
        batch: BatchSettings | None = None,
    ) -> None:
        """`curve`: the device cost curve (sizes drafter trees and cuts drafts under load); None
        uses default trees and never cuts. `batch`: the engine loop's limits."""
        self.loaded = loaded
        self.adapters = adapters
        self.pools = pools
        self.policy = policy
        self.strategy_configs = strategy_configs or {}
        self.engine = Engine(adapters.model, loaded.tokenizer, loaded.eos_token_ids, pad_width)
        self.clock = clock
        self.curve = curve
        self.ongoing = 0
        self.cancelled = 0  # requests stopped before they finished
        # (artifact dir, sha) -> drafter, its tree config, one draft level's cost (forwards)
        self._drafters: dict[tuple[str, str], tuple[object, dict | None, float]] = {}
        self._weights_sha: str | None = None
        self.scheduler = Scheduler(self.engine, batch, curve.relative if curve else None)
        # one loader thread: cold adapters convert one at a time beside the loop (more threads
        # only fight the loop for the cores and the GIL; measured in docs/performance.md)
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="adapter-loader")

    def start(self) -> ModelService:
        """Start the engine loop thread (until `stop`)."""
        self.scheduler.start()
        return self

    def stop(self) -> None:
        self.scheduler.stop()

    def health(self, stall_s: float) -> ServiceHealth:
        """Not ok when the engine loop thread died, or holds work and has not finished an
        iteration for `stall_s` seconds (hung). A loop not started yet (it starts on the first
        request) is healthy."""
        beat = self.scheduler.heartbeat()
        if beat.started and not beat.alive:
            return ServiceHealth(ok=False, reason="engine loop thread is dead")
        if beat.alive and beat.pending and beat.since_beat_s > stall_s:
            reason = f"engine loop stalled: no step for {beat.since_beat_s:.1f} s with work queued"
            return ServiceHealth(ok=False, reason=reason)
        return ServiceHealth(ok=True)

    def stats(self) -> dict:
        """Figures for metrics and health: adapter LRU counters and ongoing requests."""
        adapter_stats = self.adapters.stats
        return {
            "ongoing": self.ongoing,
            "cancelled": self.cancelled,
            **{f"batch_{k}": v for k, v in self.scheduler.stats().items()},
            "dtype": str(self.engine.model.dtype),
            "invariant": self.engine.invariance.invariant,
            "invariant_reason": self.engine.invariance.reason,
            "adapters_resident": len(self.adapters.names),
            "adapter_resident_bytes": self.adapters.resident_bytes,
            "adapter_budget_bytes": self.adapters.budget_bytes,
            "adapter_loads": adapter_stats.loads,
            "adapter_evictions": adapter_stats.evictions,
            "adapter_load_seconds_total": round(adapter_stats.load_seconds_total, 4),
        }

    def encode(self, request: GenerateRequest) -> list[int]:
        tok = self.loaded.tokenizer
        if request.messages is not None:
            return encode_messages(tok, request.messages)
        return encode_prompt(tok, request.prompt or "", chat=False)

    def choose(self, request: GenerateRequest) -> tuple[Decision, BaseModel, object]:
        """The decision for this request (the caller's `strategy`, else the request's own
        `speculation`, else the policy's), the strategy config it implies and the variant's
        drafter (None unless the strategy needs one)."""
        if request.strategy:
            decision = Decision(request.strategy, "strategy set by the caller")
        elif request.requested_strategy is not None:
            reason = f"requested by the request: speculation={request.speculation}"
            decision = Decision(request.requested_strategy, reason)
        else:
            policy = self.policy if request.target.policy is None else request.target.policy
            decision = decide(request.target, self.ongoing, policy, self.clock())
        decision, drafter, drafter_cfg = self._with_drafter(request.target, decision)
        strategy = REGISTRY.get(decision.strategy)
        base = self.strategy_configs.get(decision.strategy)
        if drafter_cfg is not None:
            tree = strategy.with_drafter_tree
            base = tree(base, drafter_cfg) if tree else drafter_cfg
        config = REGISTRY.config(decision.strategy, base)
        if decision.max_draft_tokens:
            config = REGISTRY.limited(decision.strategy, config, decision.max_draft_tokens)
        return decision, config, drafter

    def _with_drafter(self, target: Target, decision: Decision):
        """(decision, drafter, its device-sized tree config) for a strategy drafting with a
        trained drafter. One that needs it falls back to lookahead when it is refused; one that
        only adds it (hybrid) drafts from n-grams alone without one, and its reason says which."""
        strategy = REGISTRY.get(decision.strategy)
        kind = strategy.drafts_with
        if kind not in DRAFTER_KINDS.names():
            return decision, None, None
        optional = strategy.drafter_optional
        if optional and kind not in {d.kind for d in usable_drafters(target)}:
            reason = f"{decision.reason}; n-grams alone (no usable {kind} drafter)"
            return dataclasses.replace(decision, reason=reason), None, None
        try:
            drafter, drafter_cfg, _ = self.drafter(target, kind)
        except (ValueError, OSError) as err:  # mismatch, missing files: never garbage drafts
            if optional:
                reason = f"{decision.reason}; its {kind} drafter was refused ({err}); n-grams alone"
                return dataclasses.replace(decision, reason=reason), None, None
            reason = f"{decision.reason}; but its {kind} drafter was refused ({err}); lookahead"
            return Decision("lookahead", reason), None, None
        notes = list(drafter.notes or [])
        if optional:
            notes.insert(0, f"{kind} drafter loaded")
        if notes:
            decision = dataclasses.replace(decision, reason="; ".join([decision.reason, *notes]))
        return decision, drafter, drafter_cfg

    def drafter(self, target: Target, kind: str) -> tuple[object, dict | None, float]:
        """The target's `kind` drafter, loaded once and checked against this base model and the
        variant's adapter (a drafter of another version is refused), its tree config and one
        draft level's measured cost (None and 0 without a cost curve)."""
        from specserve.engine.drafters.artifact import base_weights_sha256, load_drafter

        found = [d for d in target.drafters if d.kind == kind and d.artifact_dir]
        if not found:
            raise ValueError(f"no {kind} artifact registered for {target.key or 'the base model'}")
        path = found[0].artifact_dir
        cache_key = (path, target.adapter_sha256 or "")
        if cache_key not in self._drafters:
            if self._weights_sha is None:
                self._weights_sha = base_weights_sha256(self.adapters.model)
            drafter = load_drafter(
                path,
                self.adapters.model,
                self.loaded.model_id,
                target.adapter_sha256,
                self._weights_sha,
            )
            config, level_cost = None, 0.0
            if self.curve is not None:
                from specserve.engine.drafters.budget import drafter_config

                config, level_cost = drafter_config(drafter, self.curve)
            self._drafters[cache_key] = (drafter, config, level_cost)
        return self._drafters[cache_key]

    def prepare_variant(self, target: Target) -> PreparedAdapter | None:
        """Validate, check against its registered sha256 and convert the target's adapter unless
        resident (a worker thread: the engine loop keeps stepping meanwhile)."""
        if target.key is None:
            return None
        if not target.adapter_path:
            raise ValueError(f"variant {target.key}: no adapter path")
        return self.adapters.prepare(str(target.key), target.adapter_path, target.adapter_sha256)

    def ensure_variant(self, target: Target, prepared: PreparedAdapter | None = None) -> str:
        """Make the target's adapter resident (installing `prepared`, else loading it here);
        its resident name, `BASE_ADAPTER` for the base model."""
        if target.key is None:
            return BASE_ADAPTER
        if prepared is not None:
            self.adapters.install(prepared)
            return prepared.name
        if not target.adapter_path:
            raise ValueError(f"variant {target.key}: no adapter path")
        self.adapters.ensure(str(target.key), target.adapter_path, target.adapter_sha256)
        return str(target.key)

    def release_variant(self, key: str) -> None:
        """The router no longer places `key` here: evict its adapter between steps (kept while a
        request holds it; LRU eviction drops it later)."""
        if self.scheduler.running:
            self.scheduler.call(lambda: self.adapters.evict(key))
        else:
            self.adapters.evict(key)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta | Done]:
        """Yield delta events, then a done event, per choice (`index`; n > 1 share one prefill);
        cancelling the consumer stops the decode (its rows leave the batch at the next step).
        Raises Overloaded when the queue is full."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink_for(index: int):
            def sink(step, finished: bool) -> None:
                # a consumer whose loop already closed (it cancelled, the step raced it) has
                # nobody to tell; raising here would take the engine thread, and every other
                # request, down
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(events.put_nowait, (index, step, finished))

            return sink

        if not self.scheduler.heartbeat().started:
            self.start()  # never a second loop: a dead one refuses (EngineDead -> Overloaded)
        # a cold adapter is read and converted on a worker thread while the loop keeps stepping;
        # the hand-over to the store happens on the engine thread, between steps
        adapter = None
        key = request.target.key
        if key is not None and str(key) not in self.adapters:
            adapter = await loop.run_in_executor(self._loader, self.prepare_variant, request.target)
        started = self.scheduler.call(lambda: self._prepare(request, adapter))
        # a consumer gone before this returns drops the result: its hold (a context-manager
        # generator) is closed when the ExitStack is freed
        try:
            states, decision, hold = await asyncio.wrap_future(started)
        except EngineDead as err:  # 503 + Retry-After: another replica, or this one replaced
            raise Overloaded(f"{self.loaded.model_id}: {err}") from None
        self.ongoing += 1
        left = set(range(len(states)))
        try:
            tickets = self._submit(request, states, [sink_for(i) for i in left])
            try:
                while left:
                    index, step, finished = await events.get()
                    if step is not None and (step.text or step.logprobs):
                        yield Delta(
                            text=step.text,
                            token_ids=step.new_ids,
                            logprobs=decoded_logprobs(step.logprobs, self._piece),
                            index=index,
                        )
                    if finished and index in left:
                        left.discard(index)
                        error = tickets[index].error
                        if error is not None:
                            raise RuntimeError(f"generation failed: {error}") from error
                        done = self._done(request, states[index], decision)
                        yield done.model_copy(update={"index": index})
            finally:
                if left:  # the consumer went away (client disconnect, cancellation)
                    for index in left:
                        self.scheduler.cancel(tickets[index])
                    self.cancelled += 1
        finally:
            self.ongoing -= 1
            hold.close()

    def _submit(self, request: GenerateRequest, states: list[RequestState], sinks: list):
        """Queue the request's choices (one prefill for all); Overloaded when the queue is full."""
        load_aware = request.load_aware
        tenant = str(request.target.key or "")
        try:
            if len(states) == 1:
                return [self.scheduler.submit(states[0], tenant, load_aware, sinks[0])]
            return self.scheduler.submit_group(states, tenant, load_aware, sinks)
        except (QueueFull, EngineDead) as err:
            raise Overloaded(f"{self.loaded.model_id}: {err}") from None

    def _piece(self, token_id: int) -> str:
        """One token's text as logprobs name it (special tokens spelled out, e.g. EOS)."""
        return self.loaded.tokenizer.decode([token_id], skip_special_tokens=False)

    def _prepare(self, request: GenerateRequest, prepared: PreparedAdapter | None = None):
        """On the engine thread: make the adapter resident, pick the strategy, start the request's
        choices. Returns (states, decision, an ExitStack holding the adapter until it ends)."""
        hold = contextlib.ExitStack()
        try:
            adapter = self.ensure_variant(request.target, prepared)
            if adapter != BASE_ADAPTER:
                hold.enter_context(self.adapters.hold(adapter))
            decision, config, drafter = self.choose(request)
            ids = self.encode(request)
            pool = self.pools.pool(request.target.key)
            base_seed = request.params.seed
            if base_seed is None and request.n > 1:  # unseeded choices: each its own sample
                base_seed = random.SystemRandom().randrange(2**31)
            states = [
                self.engine.start(
                    ids,
                    request.params if request.n == 1 else request.choice_params(i, base_seed),
                    decision.strategy,
                    config,
                    pool,
                    adapter,
                    drafter,
                )
                for i in range(request.n)
            ]
        except BaseException:
            hold.close()
            raise
        return states, decision, hold

    def _decode_cost(self, state: RequestState, result) -> tuple[int, float] | None:
        """(decode tokens, their cost in forwards) of a finished request (`speed`)."""
        drafter = getattr(state.proposer, "drafter", None)
        level_cost = next((c for d, _, c in self._drafters.values() if d is drafter), 0.0)
        return request_cost(result, self.curve, drafter, level_cost)

    def _done(self, request: GenerateRequest, state: RequestState, decision: Decision) -> Done:
        result = self.engine.result(state)
        costed = self._decode_cost(state, result)
        reason = decision.reason
        if state.capped_steps:
            reason += f"; load: drafts cut in {state.capped_steps} of {state.forwards} steps"
        prompt, completion = len(result.prompt_ids), len(result.output_ids)
        return Done(
            finish_reason=result.finish_reason,
            usage=Usage(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
            ),
            specserve=DoneInfo(
                variant=request.target.name,
                version=request.target.version or None,
                strategy=decision.strategy,
                reason=reason,
                tau=round(result.tau, 3),
                load_capped_steps=state.capped_steps,
                forwards=result.forwards,
                drafted_by_depth=result.drafted_by_depth,
                accepted_by_depth=result.accepted_by_depth,
                accepted_by_source=result.accepted_by_source,
                train_kind=decision.train_kind,
                retrain_kind=decision.retrain_kind,
                invariant=self.engine.invariance.invariant,
                decode_cost=round(costed[1], 3) if costed else None,
                decode_tokens=costed[0] if costed else 0,
            ),
        )
