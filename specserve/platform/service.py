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
import random
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict

from specserve.adapters.resident import PreparedAdapter, ResidentAdapters
from specserve.adapters.variants import PoolBook
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.batch.tickets import EngineDead, QueueFull, Ticket
from specserve.engine.decode.engine import Engine
from specserve.engine.decode.state import RequestState
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.prompts import encode_messages, encode_prompt
from specserve.platform.done_event import done_event
from specserve.platform.drafter_cache import DrafterCache, LoadedDrafter
from specserve.platform.events import Delta, Done
from specserve.platform.replica_stats import AdapterFigures, Numerics, ReplicaStats
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.speed import request_cost
from specserve.platform.step_events import StepEvents, delta
from specserve.platform.strategy_choice import choose
from specserve.policies.router import Decision
from specserve.policies.settings import PolicySettings


class Overloaded(Exception):
    """The model server cannot take the request now (queue full); the gateway answers 503."""


class ReplicaLost(Exception):
    """The model server holding a request died or became unreachable mid-request (raised by a
    backend; the gateway ends the response with an error, or retries one that has not started)."""


class ServiceHealth(BaseModel):
    """Whether the engine loop serves: ok, else why not (a health check raises with it)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reason: str = ""


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
        self.drafters = DrafterCache(adapters.model, loaded.model_id, curve)
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

    def stats(self) -> ReplicaStats:
        """Figures for metrics and health: requests, the engine loop, adapters and numerics."""
        adapters, counters = self.adapters, self.adapters.stats
        choice = self.loaded.dtype_choice
        figures = AdapterFigures(
            resident=len(adapters.names),
            resident_bytes=adapters.resident_bytes,
            budget_bytes=adapters.budget_bytes,
            loads=counters.loads,
            evictions=counters.evictions,
            load_seconds_total=round(counters.load_seconds_total, 4),
        )
        numerics = Numerics(
            dtype=str(self.engine.model.dtype),
            dtype_reason=choice.reason if choice else None,
            invariant=self.engine.invariance.invariant,
            invariant_reason=self.engine.invariance.reason,
        )
        batch = self.scheduler.stats()
        return ReplicaStats(
            ongoing=self.ongoing,
            cancelled=self.cancelled,
            batch=batch,
            adapters=figures,
            numerics=numerics,
        )

    def encode(self, request: GenerateRequest) -> list[int]:
        tok = self.loaded.tokenizer
        if request.messages is not None:
            return encode_messages(tok, request.messages)
        return encode_prompt(tok, request.prompt or "", chat=False)

    def choose(self, request: GenerateRequest) -> tuple[Decision, BaseModel, object]:
        """The request's decision, strategy config and drafter (`strategy_choice.choose`)."""
        now = self.clock()
        return choose(request, self.ongoing, self.policy, now, self.strategy_configs, self.drafter)

    def drafter(self, target: Target, kind: str) -> LoadedDrafter:
        """The target's `kind` drafter, its tree config and one level's cost (`DrafterCache`)."""
        return self.drafters.get(target, kind)

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
        events = StepEvents(asyncio.get_running_loop())
        states, decision, hold = await self._started(request)
        self.ongoing += 1
        left = set(range(len(states)))
        try:
            tickets = self._submit(request, states, [events.sink(i) for i in left])
            try:
                while left:
                    index, step, finished = await events.get()
                    step_delta = delta(index, step, self._piece)
                    if step_delta is not None:
                        yield step_delta
                    if finished and index in left:
                        left.discard(index)
                        yield self._done(request, states[index], decision, tickets[index], index)
            finally:
                if left:  # the consumer went away (client disconnect, cancellation)
                    for index in left:
                        self.scheduler.cancel(tickets[index])
                    self.cancelled += 1
        finally:
            self.ongoing -= 1
            hold.close()

    async def _started(self, request: GenerateRequest):
        """Start the loop if needed, make the adapter resident and start the request's choices
        on the engine thread: (states, decision, hold) as `_prepare` returns them."""
        if not self.scheduler.heartbeat().started:
            self.start()  # never a second loop: a dead one refuses (EngineDead -> Overloaded)
        tenant = _tenant(request)
        try:  # a place held from here, so an overloaded replica refuses before preparing
            self.scheduler.claim(tenant)
        except (QueueFull, EngineDead) as err:
            raise Overloaded(f"{self.loaded.model_id}: {err}") from None
        try:
            return await self._prepared(request)
        except BaseException:
            self.scheduler.unclaim(tenant)
            raise

    async def _prepared(self, request: GenerateRequest):
        """The adapter made resident, then `_prepare` run on the engine thread."""
        # a cold adapter is read and converted on a worker thread while the loop keeps stepping;
        # the hand-over to the store happens on the engine thread, between steps
        adapter = None
        key = request.target.key
        if key is not None and str(key) not in self.adapters:
            loop = asyncio.get_running_loop()
            adapter = await loop.run_in_executor(self._loader, self.prepare_variant, request.target)
        started = self.scheduler.call(lambda: self._prepare(request, adapter))
        # a consumer gone before this returns drops the result: its hold (a context-manager
        # generator) is closed when the ExitStack is freed
        try:
            return await asyncio.wrap_future(started)
        except EngineDead as err:  # 503 + Retry-After: another replica, or this one replaced
            raise Overloaded(f"{self.loaded.model_id}: {err}") from None

    def _submit(self, request: GenerateRequest, states: list[RequestState], sinks: list):
        """Queue the request's choices (one prefill for all); Overloaded when the queue is full."""
        load_aware, tenant = request.load_aware, _tenant(request)
        try:  # uses up the claim `_started` took
            if len(states) == 1:
                return [
                    self.scheduler.submit(states[0], tenant, load_aware, sinks[0], claimed=True)
                ]
            return self.scheduler.submit_group(states, tenant, load_aware, sinks, claimed=True)
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

    def _done(
        self,
        request: GenerateRequest,
        state: RequestState,
        decision: Decision,
        ticket: Ticket,
        index: int,
    ) -> Done:
        """Choice `index`'s Done event; raises when its decode failed."""
        if ticket.error is not None:
            raise RuntimeError(f"generation failed: {ticket.error}") from ticket.error
        result = self.engine.result(state)
        drafter = getattr(state.proposer, "drafter", None)
        level_cost = self.drafters.level_cost(drafter)
        costed = request_cost(result, self.curve, drafter, level_cost)
        invariant = self.engine.invariance.invariant
        done = done_event(request, state, result, decision, costed, invariant)
        return done.model_copy(update={"index": index})


def _tenant(request: GenerateRequest) -> str:
    """The scheduler's fairness key: the variant (empty for the base model)."""
    return str(request.target.key or "")
