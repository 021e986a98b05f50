"""The gateway app's HTTP plumbing: error handlers that answer every failure as an OpenAI error
body with the request id (a store outage: 503 registry_unavailable); `BodyLimit` (413 before the
app reads); `RequestIds` (an `x-request-id` on every response, the client's if it sent one).
"""

from __future__ import annotations

import logging
import re
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from specserve.platform.api.errors import (
    ApiError,
    internal_error,
    registry_unavailable,
    validation_error,
)
from specserve.platform.api.metrics import Metrics
from specserve.platform.state.store import StoreError

log = logging.getLogger(__name__)
REQUEST_ID_HEADER = "x-request-id"
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # a client's id we repeat back


def add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every failure as an OpenAI error body, counted in `metrics`: ApiError as raised, request
    validation as 400, HTTP errors (unknown route, method) with their status, a store outage as
    503 registry_unavailable, and anything else as a 500 whose detail goes only to the log."""

    def answer(request: Request, err: ApiError) -> JSONResponse:
        metrics.observe_error(_endpoint(request), err.status, err.code)
        rid = request_id(request)
        headers = err.headers | {REQUEST_ID_HEADER: rid}  # also here: a 500 skips RequestIds
        return JSONResponse(err.body(rid), err.status, headers=headers)

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
        where = f"{request_id(request)}: {request.method} {_endpoint(request)}"
        log.warning("%s: registry store failed: %s", where, err)
        return answer(request, registry_unavailable())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        where = f"{request_id(request)}: {request.method} {_endpoint(request)}"
        log.error("%s failed", where, exc_info=err)
        return answer(request, internal_error())


def _endpoint(request: Request) -> str:
    """The route's path template (`/admin/variants/{name}`), so metric labels stay few."""
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


def request_id(request: Request) -> str:
    """The id `RequestIds` gave this request (a fresh one if the app runs without it)."""
    return request.scope.get("state", {}).get("request_id") or _new_request_id()


def _new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


class RequestIds:
    """ASGI middleware: every HTTP request gets an id, the client's `x-request-id` when it sent
    a sane one (1-128 of `A-Za-z0-9._:-`), else a new `req-...`; it is in `scope["state"]`
    (`request_id(request)`) and in the `x-request-id` header of the response, streamed or not."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(REQUEST_ID_HEADER.encode(), b"")
        given = sent.decode("latin-1")
        rid = given if _CLIENT_REQUEST_ID.fullmatch(given) else _new_request_id()
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        await self.app(scope, receive, send_with_id)


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
            return await _too_large(self.limit, scope)(scope, receive, send)
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
            await _too_large(self.limit, scope)(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def _too_large(limit: int, scope: Scope) -> JSONResponse:
    rid = scope.get("state", {}).get("request_id")
    error = ApiError(413, f"request body exceeds {limit} bytes", code="body_too_large")
    return JSONResponse(error.body(rid), 413)
