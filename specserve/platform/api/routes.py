"""The gateway's FastAPI app (`create_app`): the OpenAI routes (`/v1/completions`,
`/v1/chat/completions`, `/v1/models`), `/healthz`, `/health` (liveness only) and `/metrics`, each
answered by the `Gateway`, the admin API and others mounted beside them, and the HTTP plumbing
(middleware.py) around them all.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from specserve.platform.api.errors import MODEL_LIST_ERRORS, MODEL_ROUTE_ERRORS
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.middleware import BodyLimit, RequestIds, add_error_handlers
from specserve.platform.api.openai_api import ChatCompletionRequest, CompletionRequest
from specserve.platform.api.resolve import bearer
from specserve.platform.api.responses import ChatCompletion, TextCompletion

STALE_HEADER = "x-specserve-stale"  # "true" on a model list served from cache, the store down
HEALTH_ERRORS = {503: {"description": "`status: draining`: this gateway is shutting down"}}


def _answered(model: type, chunk: str) -> dict:
    """The OpenAPI 200 of a model route: `model` as JSON, or with `stream` its chunks."""
    description = (
        f"the response; with `stream`: server-sent events, each a `{chunk}`, then `[DONE]`"
    )
    return {200: {"model": model, "description": description}}


def create_app(gateway: Gateway, *routers) -> FastAPI:
    """The app: OpenAI routes, then `routers` (the admin API, fault injection)."""
    app = FastAPI(
        title="specserve",
        version="0.1.0",
        description="OpenAI-compatible LLM serving with lossless speculative decoding",
    )
    add_error_handlers(app, gateway.metrics)
    app.include_router(openai_router(gateway))
    for router in routers:
        app.include_router(router)
    app.add_middleware(BodyLimit, limit=gateway.settings.max_body_bytes)
    app.add_middleware(RequestIds)  # added last: outermost, so a 413 carries the id too
    return app


def openai_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    completion = _answered(TextCompletion, "TextCompletionChunk") | MODEL_ROUTE_ERRORS
    chat = _answered(ChatCompletion, "ChatCompletionChunk") | MODEL_ROUTE_ERRORS

    @router.post("/v1/completions", responses=completion)
    async def completions(body: CompletionRequest, request: Request):
        return await gateway.run("completions", body, request)

    @router.post("/v1/chat/completions", responses=chat)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await gateway.run("chat", body, request)

    @router.get("/v1/models", responses=MODEL_LIST_ERRORS)
    async def list_models(request: Request):
        # a thread: a cache miss reads the store
        models = await asyncio.to_thread(gateway.models, bearer(request))
        headers = {STALE_HEADER: "true"} if models.stale else {}
        return Response(models.body, media_type="application/json", headers=headers)

    @router.get("/health", responses=HEALTH_ERRORS)
    async def health():
        # vLLM's liveness route, which load clients (guidellm) probe before a run: no store
        # read, 200 while serving, 503 once draining; /healthz is the detailed one
        status = "draining" if gateway.drain.draining else "ok"
        return JSONResponse({"status": status}, status_code=503 if status == "draining" else 200)

    @router.get("/healthz", responses=HEALTH_ERRORS)
    async def healthz():
        body = await asyncio.to_thread(gateway.health)
        body["serving"] = await gateway.serving()  # dtype, invariant: true|false per model
        # draining: load balancers and readiness probes take this replica out of rotation
        return JSONResponse(body, status_code=503 if body["status"] == "draining" else 200)

    @router.get("/metrics")
    async def metrics():
        for replica, stats in (await gateway.backend.replica_stats()).items():
            gateway.metrics.observe_replica(replica.split("/")[0], replica, stats)
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    return router
