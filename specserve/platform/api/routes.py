"""The HTTP surface of the gateway: the OpenAI routes (`/v1/completions`, `/v1/chat/completions`,
`/v1/models`), `/healthz` and `/metrics`; error handlers that answer every failure as an OpenAI
error body (a store outage: 503 registry_unavailable); `BodyLimit` (413 before the app reads).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from specserve.platform.api.metrics import Metrics
from specserve.platform.api.openai_api import (
    RETRY_LATER,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    internal_error,
    registry_unavailable,
    validation_error,
)
from specserve.platform.api.resolve import bearer
from specserve.platform.state.store import StoreError

if TYPE_CHECKING:
    from specserve.platform.api.gateway import Gateway

log = logging.getLogger(__name__)
STALE_HEADER = "x-specserve-stale"  # "true" on a model list served from cache, the store down


def openai_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions", responses=RETRY_LATER)
    async def completions(body: CompletionRequest, request: Request):
        return await gateway.run("completions", body, request)

    @router.post("/v1/chat/completions", responses=RETRY_LATER)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await gateway.run("chat", body, request)

    @router.get("/v1/models")
    async def list_models(request: Request):
        # a thread: a cache miss reads the store
        models = await asyncio.to_thread(gateway.models, bearer(request))
        headers = {STALE_HEADER: "true"} if models.stale else {}
        return Response(models.body, media_type="application/json", headers=headers)

    @router.get("/healthz")
    async def healthz():
        return await asyncio.to_thread(gateway.health)

    @router.get("/metrics")
    async def metrics():
        for replica, stats in (await gateway.backend.replica_stats()).items():
            gateway.metrics.observe_replica(replica.split("/")[0], replica, stats)
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    return router


def add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every failure as an OpenAI error body, counted in `metrics`: ApiError as raised, request
    validation as 400, HTTP errors (unknown route, method) with their status, a store outage as
    503 registry_unavailable, and anything else as a 500 whose detail goes only to the log."""

    def answer(request: Request, err: ApiError) -> JSONResponse:
        metrics.observe_error(_endpoint(request), err.status, err.code)
        return JSONResponse(err.body(), err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return answer(request, err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        errors = err.errors()
        if errors and errors[0].get("type") == "json_invalid":
            api = ApiError(400, f"malformed JSON body: {errors[0].get('msg')}", code="invalid_json")
        else:
            api = validation_error(err)
        return answer(request, api)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException):
        message = f"{err.detail} ({request.method} {request.url.path})"
        return answer(request, ApiError(err.status_code, message, headers=err.headers))

    @app.exception_handler(StoreError)
    async def _store_down(request: Request, err: StoreError):
        log.warning("%s %s: registry store failed: %s", request.method, _endpoint(request), err)
        return answer(request, registry_unavailable())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        log.error("%s %s failed", request.method, _endpoint(request), exc_info=err)
        return answer(request, internal_error())


def _endpoint(request: Request) -> str:
    """The route's path template (`/admin/variants/{name}`), so metric labels stay few."""
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


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
