"""The OpenAI-compatible gateway: resolves `model` to a base model or variant@version through the
registry, applies limits and tenant keys, relays model-server events as JSON or SSE, and records
metrics. Resolution and the `/v1/models` listing are cached until the registry's generation moves.
`create_app(gateway)` builds the FastAPI app (admin routes under /admin)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from specserve.engine.sampling import SamplingParams
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    validation_error,
)
from specserve.platform.backend import Backend, Overloaded
from specserve.platform.service import GenerateRequest, Target
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.registry import Registry, UnknownVariant, VariantInfo
from specserve.platform.state.store import StoreError

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
    ) -> None:
        """`on_train(name, version, kind)`: called (in a thread) when the policy asks for a drafter."""
        self.on_train = on_train
        self.settings = settings
        self.registry = registry
        self.backend = backend
        self.metrics = metrics
        self.inflight: dict[str, int] = {m: 0 for m in settings.models}
        self._store_ok = (0.0, True, "")  # (checked_at, ok, error)
        self._targets: dict[
            str, tuple[tuple[str, Target], int]
        ] = {}  # model -> (found, generation)
        self._catalog: tuple[list[tuple[str, dict]], int] | None = None  # (entries, generation)
        self._rendered: tuple[int | None, dict] = (None, {})  # generation, allowed -> JSON body
        self._catalog_refresh = threading.Lock()  # one thread re-reads the list, others wait
        self._cache_lock = threading.Lock()
        self._store_down_until = 0.0
        self._acceptance: dict[tuple[str, int, str], list[int]] = {}  # flushed in the background
        self._flusher = threading.Thread(
            target=self._flush_loop, name="acceptance-flush", daemon=True
        )
        self._flusher.start()

    # -- resolution
    def allowed(self, api_key: str | None) -> frozenset[str] | None:
        """Variants this caller may use beyond public ones (None: no tenant keys configured)."""
        keys = self.settings.tenant_keys.variants_by_key
        if not keys:
            return None
        if api_key is None:
            return frozenset()
        if api_key not in keys:
            raise ApiError(401, "invalid API key", "authentication_error", code="invalid_api_key")
        return keys[api_key]

    def _owned(self) -> frozenset[str]:
        """Every variant some tenant owns (hidden from callers without that tenant's key)."""
        return frozenset().union(*self.settings.tenant_keys.variants_by_key.values())

    def _visible(
        self, name: str, allowed: frozenset[str] | None, owned: frozenset[str] | None = None
    ) -> bool:
        if allowed is None:
            return True
        owned = self._owned() if owned is None else owned
        return name not in owned or name in allowed

    def resolve(self, model: str, api_key: str | None) -> tuple[str, Target]:
        """(base model, target) for a request's `model`; 404 naming `model` if unknown or hidden.
        Variant lookups are cached until the registry's generation changes; with the store down,
        the last known target keeps serving (503 only for a variant never seen)."""
        allowed = self.allowed(api_key)
        if model in self.settings.models:
            return model, Target()
        found = self._cached_target(model)
        if found is None or not self._visible(found[1].name, allowed):
            raise ApiError(
                404, f"The model '{model}' does not exist", param="model", code="model_not_found"
            )
        return found

    def _cached_target(self, model: str) -> tuple[str, Target] | None:
        now = time.monotonic()
        with self._cache_lock:
            entry = self._targets.get(model)
            if now < self._store_down_until:
                if entry is None:
                    raise ApiError(
                        503,
                        "the variant registry is unreachable; retry shortly",
                        "server_error",
                        code="registry_unavailable",
                        headers={"Retry-After": "2"},
                    )
                return entry[0]
        try:
            generation = self.registry.generation()  # one small read; bumped on every write
            if entry is not None and entry[1] == generation:
                return entry[0]
            found = self._lookup(model)
        except StoreError as err:
            with self._cache_lock:
                self._store_down_until = time.monotonic() + 5.0  # don't make every request wait
            log.warning("registry unreachable (%s); serving cached variants", err)
            return self._cached_target(model)
        with self._cache_lock:
            self._targets[model] = (found, generation)
        return found

    def _lookup(self, model: str) -> tuple[str, Target] | None:
        try:
            record = self.registry.resolve(model)
        except (UnknownVariant, ValueError):
            return None
        if record.base_model not in self.settings.models:
            return None
        key = record.key
        drafters = [
            {
                "kind": kind,
                "status": status.state,
                "held_out_tau": status.tau,
                "artifact_dir": status.artifact_dir,
            }
            for kind, status in self.registry.drafters(key).items()
        ]
        measured = {s: (a.tau or 0.0, a.tokens) for s, a in self.registry.acceptance(key).items()}
        policy = self.registry.policy_settings()
        target = Target(
            name=record.name,
            version=record.version,
            adapter_path=record.adapter_path,
            adapter_sha256=record.adapter_sha256,
            version_times=[v.created_at for v in self.registry.versions(record.name)],
            drafters=drafters,
            measured_tau=measured,
            forced_strategy=self.registry.override(record.name),
            policy=policy,
        )
        return record.base_model, target

    def sampling(self, req: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        max_tokens = req.max_tokens or self.settings.default_max_tokens
        if max_tokens > self.settings.max_tokens:
            raise ApiError(
                400,
                f"max_tokens {max_tokens} exceeds this server's cap of {self.settings.max_tokens}",
                param="max_tokens",
                code="max_tokens_too_large",
            )
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            stop=req.stop or [],
            ignore_eos=req.ignore_eos,
        )

    # -- generation
    async def run(self, endpoint: str, req, http: Request) -> Response:
        if self.settings.models and all(
            self.inflight[m] >= self.settings.max_inflight_per_model for m in self.settings.models
        ):  # refuse before any registry lookup: an overloaded server must answer 503 fast
            raise _at_capacity("every model")
        base_model, target = await asyncio.to_thread(self.resolve, req.model, _bearer(http))
        params = self.sampling(req)
        if isinstance(req, ChatCompletionRequest):
            gen = GenerateRequest(target=target, messages=req.chat(), params=params)
        else:
            gen = GenerateRequest(target=target, prompt=req.prompt, params=params)
        if self.inflight[base_model] >= self.settings.max_inflight_per_model:
            raise _at_capacity(base_model)
        self.inflight[base_model] += 1
        try:
            events = self.backend.stream(base_model, gen)
            first = await _first(events)
        except BaseException:
            self.inflight[base_model] -= 1
            raise
        meta = _Meta(endpoint, base_model, req.model, time.perf_counter())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            body = self._sse(meta, first, events, include_usage)
            return StreamingResponse(
                body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        try:
            return await self._collect(meta, first, events, http)
        finally:
            self.inflight[base_model] -= 1

    async def _collect(
        self, meta: _Meta, first: dict, events: AsyncIterator[dict], http: Request
    ) -> Response:
        parts, event = [], first
        while event["type"] == "delta":
            meta.tick()
            parts.append(event["text"])
            if await http.is_disconnected():
                await events.aclose()
                raise asyncio.CancelledError("client disconnected")
            event = await anext(events)
        self._observe(meta, event)
        text = "".join(parts)
        if meta.endpoint == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": event["finish_reason"],
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": event["finish_reason"],
                "logprobs": None,
            }
        return JSONResponse(
            meta.envelope([choice], event)
            | {"usage": event["usage"], "specserve": event["specserve"]}
        )

    async def _sse(
        self, meta: _Meta, first: dict, events: AsyncIterator[dict], include_usage: bool
    ) -> AsyncIterator[str]:
        try:
            if meta.endpoint == "chat":
                yield _data(
                    meta.envelope(
                        [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None,
                            }
                        ]
                    )
                )
            event = first
            while event["type"] == "delta":
                meta.tick()
                yield _data(meta.envelope([meta.chunk_choice(event["text"], None)]))
                event = await anext(events)
            self._observe(meta, event)
            final = meta.envelope([meta.chunk_choice("", event["finish_reason"])]) | {
                "specserve": event["specserve"]
            }
            yield _data(final)
            if include_usage:
                yield _data(meta.envelope([]) | {"usage": event["usage"]})
            yield "data: [DONE]\n\n"
        finally:
            self.inflight[meta.base_model] -= 1
            await events.aclose()

    def _observe(self, meta: _Meta, done: dict) -> None:
        now = time.perf_counter()
        self.metrics.observe_request(
            meta.endpoint, meta.base_model, done, now - meta.started, meta.ttft, meta.gaps
        )
        info = done["specserve"]
        if info["variant"]:
            self._record_acceptance(info, done["usage"]["completion_tokens"])
            if info.get("train_kind") and self.on_train is not None:
                args = (info["variant"], info["version"], info["train_kind"])
                threading.Thread(target=self._train, args=args, daemon=True).start()

    def _record_acceptance(self, info: dict, tokens: int) -> None:
        """Add figures locally; a background thread flushes them (requests never wait on Redis)."""
        figures = [
            tokens,
            info["forwards"],
            sum(info["drafted_by_depth"]),
            sum(info["accepted_by_depth"]),
        ]
        with self._cache_lock:
            total = self._acceptance.setdefault(
                (info["variant"], info["version"], info["strategy"]), [0, 0, 0, 0]
            )
            for i, value in enumerate(figures):
                total[i] += value

    def _train(self, name: str, version: int, kind: str) -> None:
        try:
            if self.on_train(name, version, kind):
                log.info("policy queued %s training for %s@%s", kind, name, version)
        except StoreError as err:
            log.warning("could not queue %s training for %s@%s: %s", kind, name, version, err)

    def flush_acceptance(self) -> None:
        """Send accumulated figures to the registry; kept for the next round if the store is down."""
        from specserve.adapters.variants import VariantKey

        with self._cache_lock:
            pending, self._acceptance = self._acceptance, {}
        for i, ((variant, version, strategy), (tokens, forwards, drafted, accepted)) in enumerate(
            pending.items()
        ):
            try:
                self.registry.record_acceptance(
                    VariantKey(variant, version),
                    strategy,
                    tokens=tokens,
                    forwards=forwards,
                    drafted=drafted,
                    accepted=accepted,
                )
            except StoreError as err:
                log.debug("acceptance figures kept for later: %s", err)
                with self._cache_lock:
                    for key, values in list(pending.items())[i:]:
                        total = self._acceptance.setdefault(key, [0, 0, 0, 0])
                        for j, value in enumerate(values):
                            total[j] += value
                return

    def _flush_loop(self, every_s: float = 5.0) -> None:
        while True:
            time.sleep(every_s)
            self.flush_acceptance()

    # -- health and listing
    def health(self) -> dict:
        """Cheap: the store is pinged at most every 2 s; always answers (degraded, not down)."""
        checked_at, ok, error = self._store_ok
        if time.monotonic() - checked_at > 2.0:
            try:
                self.registry.store.ping()
                ok, error = True, ""
            except StoreError as err:
                ok, error = False, str(err)[:200]
            self._store_ok = (time.monotonic(), ok, error)
            self.metrics.store_up.set(1 if ok else 0)
        body = {
            "status": "ok" if ok else "degraded",
            "store": "ok" if ok else f"unreachable: {error}",
        }
        return body | {"models": self.settings.models, "inflight": dict(self.inflight)}

    def models(self, api_key: str | None) -> dict:
        """The OpenAI model list: base models, then the variants this caller may see (names
        sorted). One small store read when nothing changed (see `_variant_entries`)."""
        allowed = self.allowed(api_key)
        return self._listing(self._variant_entries()[0], allowed)

    def models_body(self, api_key: str | None) -> bytes:
        """`models` as the JSON body of /v1/models, rendered once per registry generation and
        visibility (tenant key set)."""
        allowed = self.allowed(api_key)
        entries, generation = self._variant_entries()
        with self._cache_lock:
            rendered_at, bodies = self._rendered
            if rendered_at == generation and allowed in bodies:
                return bodies[allowed]
        listing = self._listing(entries, allowed)
        body = json.dumps(listing, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        with self._cache_lock:
            if self._rendered[0] != generation:
                self._rendered = (generation, {})
            self._rendered[1][allowed] = body.encode()
        return body.encode()

    def _listing(self, entries: list[tuple[str, dict]], allowed: frozenset[str] | None) -> dict:
        data = [
            {
                "id": m,
                "object": "model",
                "created": 0,
                "owned_by": "specserve",
                "specserve": {"kind": "base"},
            }
            for m in self.settings.models
        ]
        owned = self._owned()
        data += [e for name, e in entries if self._visible(name, allowed, owned)]
        return {"object": "list", "data": data}

    def _variant_entries(self) -> tuple[list[tuple[str, dict]], int | None]:
        """((name, model entry) of every variant on a served base model, the registry generation
        they were read at), re-read only when the generation moved: replicas see a change on
        their next call. With the store down: the last list read (([], None) if none), as
        resolution keeps serving cached targets."""
        with self._cache_lock:
            cached = self._catalog
            if time.monotonic() < self._store_down_until:
                return cached or ([], None)
        try:
            generation = self.registry.generation()  # read before the list: never newer than it
            if cached is not None and cached[1] == generation:
                return cached
            with self._catalog_refresh:
                cached = self._catalog  # refreshed by another thread meanwhile?
                if cached is not None and cached[1] == generation:
                    return cached
                entries = [self._entry(info) for info in self.registry.list()]
                served = [(name, e) for name, e in entries if e["parent"] in self.settings.models]
                with self._cache_lock:
                    self._catalog = (served, generation)
                return served, generation
        except StoreError as err:
            with self._cache_lock:
                self._store_down_until = time.monotonic() + 5.0
            log.warning("registry unreachable (%s); listing cached variants", err)
            return cached or ([], None)

    @staticmethod
    def _entry(info: VariantInfo) -> tuple[str, dict]:
        current = info.current
        return info.name, {
            "id": info.name,
            "object": "model",
            "created": int(current.created_at),
            "owned_by": "specserve",
            "parent": current.base_model,
            "specserve": {"kind": "variant", "version": current.version, "override": info.override},
        }


class _Meta:
    """Per-response bookkeeping: ids, timing of tokens."""

    def __init__(self, endpoint: str, base_model: str, model: str, started: float) -> None:
        self.endpoint, self.base_model, self.model, self.started = (
            endpoint,
            base_model,
            model,
            started,
        )
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.ttft: float | None = None
        self.gaps: list[float] = []
        self._last: float | None = None

    def tick(self) -> None:
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self.started
        else:
            self.gaps.append(now - self._last)
        self._last = now

    def envelope(self, choices: list, done: dict | None = None) -> dict:
        obj = {"chat": "chat.completion", "completions": "text_completion"}[self.endpoint]
        if done is None and self.endpoint == "chat":
            obj = "chat.completion.chunk"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk_choice(self, text: str, finish_reason: str | None) -> dict:
        if self.endpoint == "chat":
            delta = {"content": text} if text else {}
            return {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}


def _at_capacity(what: str) -> ApiError:
    return ApiError(
        503,
        f"{what} is at capacity; retry shortly",
        "overloaded_error",
        code="overloaded",
        headers={"Retry-After": "1"},
    )


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _bearer(http: Request) -> str | None:
    auth = http.headers.get("authorization", "")
    return auth[7:].strip() or None if auth.lower().startswith("bearer ") else None


async def _first(events: AsyncIterator[dict]) -> dict:
    """The first event, mapping engine/adapter errors to API errors before any byte is sent."""
    from specserve.adapters.errors import AdapterCapacityError, AdapterError

    try:
        return await anext(events)
    except Overloaded as err:
        raise ApiError(
            503, str(err), "overloaded_error", code="overloaded", headers={"Retry-After": "1"}
        ) from None
    except AdapterCapacityError as err:
        raise ApiError(
            503, str(err), "overloaded_error", code=err.code, headers={"Retry-After": "1"}
        ) from None
    except AdapterError as err:
        raise ApiError(
            500, f"variant adapter unavailable: {err}", "server_error", code=err.code
        ) from None
    except ValueError as err:
        message = str(err)
        param = "messages" if message.startswith("prompt") else None
        raise ApiError(
            400, message, param=param, code="invalid_prompt" if param else "invalid_value"
        ) from None


class BodyLimit:
    """ASGI middleware: bodies above `limit` bytes answer 413 before the app reads them."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _too_large(self.limit)(scope, receive, send)
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(self.limit)(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        ApiError(413, f"request body exceeds {limit} bytes", code="body_too_large").body(), 413
    )


def create_app(gateway: Gateway, admin_router=None) -> FastAPI:
    app = FastAPI(
        title="specserve",
        version="0.1.0",
        description="OpenAI-compatible LLM serving with lossless speculative decoding",
    )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        gateway.metrics.observe_error(request.url.path, err.status, err.code)
        return JSONResponse(err.body(), err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        errors = err.errors()
        if errors and errors[0].get("type") == "json_invalid":
            api = ApiError(400, f"malformed JSON body: {errors[0].get('msg')}", code="invalid_json")
        else:
            api = validation_error(err)
        gateway.metrics.observe_error(request.url.path, 400, api.code)
        return JSONResponse(api.body(), 400)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await gateway.run("completions", body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await gateway.run("chat", body, request)

    @app.get("/v1/models")
    async def list_models(request: Request):
        # a thread: a cache miss reads the store
        body = await asyncio.to_thread(gateway.models_body, _bearer(request))
        return Response(body, media_type="application/json")

    @app.get("/healthz")
    async def healthz():
        return await asyncio.to_thread(gateway.health)

    @app.get("/metrics")
    async def metrics():
        for replica, stats in (await gateway.backend.replica_stats()).items():
            gateway.metrics.observe_replica(replica.split("/")[0], replica, stats)
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    if admin_router is not None:
        app.include_router(admin_router)
    app.add_middleware(BodyLimit, limit=gateway.settings.max_body_bytes)
    return app
