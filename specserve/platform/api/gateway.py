"""The OpenAI-compatible gateway: `Gateway` runs one request (limits, resolution, the model server's
events shaped as JSON or SSE, metrics, measured acceptance, traffic capture, the policy's training
requests) from the parts in api/ (resolve, catalog, shaping, refusals, acceptance, traffic); the
app around it is routes.py's `create_app`. A model server's refusal reaches the client as a short
OpenAI error; its full text is logged under the request id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from specserve.engine.sampling import SamplingParams
from specserve.platform.api.acceptance import AcceptanceRecorder
from specserve.platform.api.catalog import Catalog, ModelList
from specserve.platform.api.drain import Drain
from specserve.platform.api.errors import ApiError, validation_error
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.middleware import request_id
from specserve.platform.api.openai_api import ChatCompletionRequest, CompletionRequest
from specserve.platform.api.refusals import (
    BROKEN_REASON,
    DIGEST_MISMATCH,
    Refusal,
    at_capacity,
    broken,
    first_event,
    prompt_field,
)
from specserve.platform.api.resolve import Access, RegistryReads, Resolver, StoreBreaker, bearer
from specserve.platform.api.shaping import Reply, collect, sse
from specserve.platform.api.traffic import TrafficRecorder
from specserve.platform.backend import Backend
from specserve.platform.events import Done
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.registry import Registry
from specserve.platform.state.store import StoreError
from specserve.platform.state.traffic import TrafficSample

log = logging.getLogger(__name__)


class Gateway:
    """Request handling shared by the HTTP routes; holds no per-request state."""

    def __init__(
        self,
        settings: PlatformSettings,
        registry: Registry,
        backend: Backend,
        metrics: Metrics,
        on_train=None,
        on_retrain=None,
    ) -> None:
        """`on_train(name, version, kind)`: called (in a thread) when the policy asks for a
        drafter; `on_retrain(name, version, kind)` when it asks to retrain one from traffic."""
        self.on_train, self.on_retrain = on_train, on_retrain
        self.settings = settings
        self.registry = registry
        self.backend = backend
        self.metrics = metrics
        self.inflight: dict[str, int] = {m: 0 for m in settings.models}
        self.admitting = 0  # past the drain's admission, not yet in `inflight` (resolving)
        self.access = Access(settings.tenant_keys)
        self.breaker = StoreBreaker()  # shared: a store failure seen once backs both off
        reads = RegistryReads(settings, registry, self.access, self.breaker)
        self.resolver, self.catalog = Resolver(reads), Catalog(reads)
        self.acceptance = AcceptanceRecorder(registry).start()
        self.traffic = TrafficRecorder(registry).start()
        self.drain = Drain()  # begun by the platform's stop (rayserve/drain.py) or a test
        self._store_ok = (0.0, True, "")  # (checked_at, ok, error)
        self._serving: tuple[float, dict] = (-1e9, {})  # (checked_at, per model) of `serving`
        self._store_durable: bool | None = None  # the store's answer at the last good check

    def resolve(self, model: str, api_key: str | None) -> tuple[str, Target]:
        return self.resolver.resolve(model, api_key)

    def models(self, api_key: str | None) -> ModelList:
        """/v1/models: the models this caller may see, and whether the list is stale (Catalog)."""
        return self.catalog.models(self.access.allowed(api_key))

    def flush_acceptance(self) -> None:
        self.acceptance.flush()

    def flush_traffic(self) -> None:
        self.traffic.flush()

    def sampling(self, req: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        """The request's engine settings, its max_tokens within this server's cap."""
        params = req.to_sampling(self.settings.default_max_tokens)
        if params.max_new_tokens > self.settings.max_tokens:
            raise ApiError(
                400,
                f"max_tokens {params.max_new_tokens} exceeds this server's cap of "
                f"{self.settings.max_tokens}",
                param="max_tokens",
                code="max_tokens_too_large",
            )
        return params

    def inflight_total(self) -> int:
        """Requests admitted and not yet answered, from any thread. `admitting` is read first:
        a request moving from it to `inflight` meanwhile is counted twice, never missed."""
        admitting = self.admitting
        return admitting + sum(self.inflight.values())

    async def run(self, endpoint: str, req, http: Request) -> Response:
        self.drain.admit()  # draining: 503 shutting_down before anything else
        self.admitting += 1  # the drain waits for it from here, not only once it is resolved
        try:
            base_model, gen = await self._admit(req, http)
            self.inflight[base_model] += 1  # before `admitting` falls: never out of both
        finally:
            self.admitting -= 1
        rid = request_id(http)
        try:
            events = self.drain.bounded(self.backend.stream(base_model, gen))
            first = await first_event(events, Refusal(base_model, prompt_field(req), rid))
        except BaseException as err:
            self.inflight[base_model] -= 1
            if getattr(err, "code", None) == DIGEST_MISMATCH and gen.target.key is not None:
                await asyncio.to_thread(self._mark_broken, gen.target)
            raise
        capture = gen.target.capture
        reply = Reply(endpoint, base_model, req.model, time.perf_counter(), rid, req.n, capture)

        def observe(reply: Reply, done: Done) -> None:
            self._observe(reply, done, gen)

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            def release() -> None:
                self.inflight[base_model] -= 1

            on_error = self.metrics.observe_stream_error
            body = sse(reply, first, events, include_usage, observe, release, on_error)
            return StreamingResponse(
                body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        try:
            return await collect(reply, first, events, http, observe)
        finally:
            self.inflight[base_model] -= 1

    async def _admit(self, req, http: Request) -> tuple[str, GenerateRequest]:
        """(base model, engine request) of an admitted request, or the 4xx/503 refusing it."""
        if self.settings.models and all(
            self.inflight[m] >= self.settings.max_inflight_per_model for m in self.settings.models
        ):  # refuse before any registry lookup: an overloaded server must answer 503 fast
            raise at_capacity("every model")
        base_model, target = await asyncio.to_thread(self.resolve, req.model, bearer(http))
        if target.broken:
            raise broken(target)
        params = self.sampling(req)
        chat = isinstance(req, ChatCompletionRequest)
        prompt = {"messages": req.chat()} if chat else {"prompt": req.prompt}
        try:  # `speculation` is checked against the variant here, before any model server
            gen = GenerateRequest(
                target=target, params=params, n=req.n, speculation=req.speculation, **prompt
            )
        except ValidationError as err:
            raise validation_error(err) from None
        if self.inflight[base_model] >= self.settings.max_inflight_per_model:
            raise at_capacity(base_model)
        return base_model, gen

    def _mark_broken(self, target: Target) -> None:
        """A replica refused the adapter's bytes: every gateway refuses the version from now on
        (no re-hash per request), and admin shows why. Best effort with the store down."""
        try:
            self.registry.mark_broken(target.key, BROKEN_REASON)
            log.error("variant %s marked broken: %s", target.key, BROKEN_REASON)
        except StoreError as err:
            log.warning("could not mark %s broken: %s", target.key, err)

    def _observe(self, reply: Reply, done: Done, gen: GenerateRequest) -> None:
        """A request finished: its metrics, acceptance figures, its capture (when its variant
        captures traffic) and any training it asks for."""
        latency = time.perf_counter() - reply.started
        self.metrics.observe_request(
            reply.endpoint, reply.base_model, done, latency, reply.ttft, reply.gaps
        )
        info = done.specserve
        if info.variant:
            self.acceptance.record(info, done.usage.completion_tokens)
            if reply.text is not None:
                self._capture(reply.text, done, gen)
            asks = ((info.train_kind, self.on_train), (info.retrain_kind, self.on_retrain))
            for kind, start in asks:
                if kind and start is not None:
                    args = (start, info.variant, info.version, kind)
                    threading.Thread(target=self._train, args=args, daemon=True).start()

    def _capture(self, text: str, done: Done, gen: GenerateRequest) -> None:
        """Queue the request for its variant's traffic sample; a failure is logged, never raised."""
        info = done.specserve
        try:
            sample = TrafficSample(
                prompt=gen.prompt if gen.messages is None else None,
                messages=gen.messages,
                output=text,
                finish_reason=done.finish_reason,
                version=info.version,
                strategy=info.strategy,
                at=time.time(),
            )
            self.traffic.record(info.variant, sample)
        except Exception as err:  # noqa: BLE001 - capture must never fail a request
            log.warning("traffic capture of a %s request failed: %s", info.variant, err)

    def _train(self, start, name: str, version: int, kind: str) -> None:
        try:
            if start(name, version, kind):
                log.info("policy queued %s training for %s@%s", kind, name, version)
        except StoreError as err:
            log.warning("could not queue %s training for %s@%s: %s", kind, name, version, err)

    async def serving(self) -> dict[str, dict]:
        """Per base model, how its replicas serve: dtype and whether the forward is the
        position-invariant one (one output per request whatever the batch), from replica stats
        refreshed at most every 10 s, each call bounded to 2 s ({} until a replica answers)."""
        checked_at, facts = self._serving
        if time.monotonic() - checked_at > 10.0:
            try:
                stats = await asyncio.wait_for(self.backend.replica_stats(), 2.0)
            except TimeoutError:
                stats = {}
            fresh = {
                replica.split("/")[0]: figures.numerics.model_dump(
                    include={"dtype", "invariant", "invariant_reason"}
                )
                for replica, figures in stats.items()
            }
            facts = fresh or facts
            self._serving = (time.monotonic(), facts)
        return facts

    def health(self) -> dict:
        """Cheap: the store is pinged at most every 2 s; always answers (degraded, not down).
        `store_kind` (redis-external | redis-embedded | memory) and `durable` (whether the
        registry survives a restart of its store; null: unknown) name the store."""
        checked_at, ok, error = self._store_ok
        if time.monotonic() - checked_at > 2.0:
            store = self.registry.store
            try:
                store.ping()
                ok, error = True, ""
                self._store_durable = store.durable()
            except StoreError as err:  # the address and cause go to the log, not to callers
                ok, error = False, "unreachable"
                log.warning("registry store unreachable: %s", err)
            self._store_ok = (time.monotonic(), ok, error)
            self.metrics.store_up.set(1 if ok else 0)
        body = {
            "status": "draining" if self.drain.draining else "ok" if ok else "degraded",
            "store": "ok" if ok else error,
            "store_kind": self.store_kind(),
            "durable": self._store_durable,
        }
        return body | {"models": self.settings.models, "inflight": dict(self.inflight)}

    def store_kind(self) -> str:
        """What the registry's store is: the memory store (in-process or an actor's) whatever
        the settings say, else the Redis `specserve up` started or one given by REDIS_URL."""
        if self.registry.store.kind == "memory":
            return "memory"
        return "redis-embedded" if self.settings.redis_embedded else "redis-external"
