"""The HTTP surface of the gateway: the OpenAI routes (`/v1/completions`, `/v1/chat/completions`,
`/v1/models`), `/healthz` and `/metrics`; OpenAI-shaped error handlers; and `BodyLimit`, which
answers 413 for a body above the limit before the app reads it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from specserve.platform.api.metrics import Metrics
from specserve.platform.api.openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    validation_error,
)
from specserve.platform.api.resolve import bearer

if TYPE_CHECKING:
    from specserve.platform.api.gateway import Gateway


def openai_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await gateway.run("completions", body, request)

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await gateway.run("chat", body, request)

    @router.get("/v1/models")
    async def list_models(request: Request):
        # a thread: a cache miss reads the store
        body = await asyncio.to_thread(gateway.models_body, bearer(request))
        return Response(body, media_type="application/json")

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
    """ApiError and request validation errors as OpenAI error bodies, counted in `metrics`."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        metrics.observe_error(request.url.path, err.status, err.code)
        return JSONResponse(err.body(), err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        errors = err.errors()
        if errors and errors[0].get("type") == "json_invalid":
            api = ApiError(400, f"malformed JSON body: {errors[0].get('msg')}", code="invalid_json")
        else:
            api = validation_error(err)
        metrics.observe_error(request.url.path, 400, api.code)
        return JSONResponse(api.body(), 400)


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
