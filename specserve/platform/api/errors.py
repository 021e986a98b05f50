"""OpenAI error shapes: `ApiError` is an OpenAI error body carrying the request id,
`registry_unavailable` and `internal_error` the ones any route may answer, `validation_error` a
request's invalid field as a 400 naming it as OpenAI does (`messages[0].content`); `short_message`
is what a client may see of an exception (its underlying cause's first line, no traceback, ANSI
codes, pid or address); the OpenAPI `responses` of the model routes.
"""

from __future__ import annotations

import re

from pydantic import BaseModel


class ApiError(Exception):
    """An error response: HTTP status + {"error": {"message", "type", "param", "code"}} (and the
    request id, given to `body`)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers or {}

    def body(self, request_id: str | None = None) -> dict:
        detail = ErrorDetail(
            message=self.message,
            type=self.type,
            param=self.param,
            code=self.code,
            request_id=request_id,
        )
        return ErrorBody(error=detail).model_dump()


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None
    request_id: str | None = None  # also the response's `x-request-id`; the log lines carry it


class ErrorBody(BaseModel):
    """An OpenAI error response body."""

    error: ErrorDetail


REGISTRY_RETRY_AFTER_S = 2
RETRY_LATER = {
    503: {
        "model": ErrorBody,
        "description": "`registry_unavailable` (the variant registry's store is down) or, on a "
        "model request, `overloaded` or `shutting_down` (the server is draining before it "
        "stops): retry after `Retry-After` seconds",
        "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
    }
}  # the OpenAPI `responses` of a route that may answer 503


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


MODEL_ROUTE_ERRORS = {
    400: _error("invalid request: `param` names the field (`n`, `messages[0].content`)"),
    401: _error("`invalid_api_key`: the key is not a tenant's (when tenant keys are set)"),
    404: _error("`model_not_found`: the model is unknown or hidden from this key"),
    413: _error("`body_too_large`: the body exceeds the server's limit"),
    500: _error("`internal_error` or an adapter that cannot be loaded; details in the log"),
    "default": _error("any other error, as an OpenAI error body"),  # request validation is 400
} | RETRY_LATER  # the OpenAPI `responses` of /v1/completions and /v1/chat/completions
MODEL_LIST_ERRORS = {k: MODEL_ROUTE_ERRORS[k] for k in (401, 500)} | RETRY_LATER
SHORT_MESSAGE_CHARS = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def underlying(err: BaseException) -> BaseException:
    """The exception a model server raised, unwrapped from Ray's RayTaskError (its `cause`)."""
    while isinstance(getattr(err, "cause", None), BaseException):
        err = err.cause
    return err


def short_message(err: BaseException) -> str:
    """What a client may read of `err`: its underlying cause's own first line, ANSI codes
    stripped, at most SHORT_MESSAGE_CHARS; the exception's type name when that is empty."""
    cause = underlying(err)
    lines = _ANSI.sub("", str(cause)).strip().splitlines()
    return (lines[0].strip() if lines else type(cause).__name__)[:SHORT_MESSAGE_CHARS]


def registry_unavailable() -> ApiError:
    """503 `registry_unavailable`: the variant registry's store cannot be read or written now."""
    return ApiError(
        503,
        "the variant registry is unreachable; retry shortly",
        "server_error",
        code="registry_unavailable",
        headers={"Retry-After": str(REGISTRY_RETRY_AFTER_S)},
    )


def internal_error() -> ApiError:
    """500 `internal_error` for an unexpected exception: a short message, the detail is logged."""
    return ApiError(
        500,
        "internal server error; the details are in the server log",
        "server_error",
        code="internal_error",
    )


_REQUEST_PARTS = frozenset({"body", "query", "path", "header", "cookie"})
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def field_param(loc: tuple) -> str | None:
    """A pydantic error location as OpenAI names a field: `n`, `messages[0].content`; without
    the request part (`body`) and union-member tags (`str`, `list[TextPart]`, `function-...`)."""
    parts = list(loc[1:] if loc and loc[0] in _REQUEST_PARTS else loc)
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part.isidentifier() and part not in _UNION_TAGS:
            name += f".{part}" if name else part
    return name or None


def validation_error(err) -> ApiError:
    """A pydantic ValidationError as a 400 naming the first offending field."""
    first = err.errors()[0]
    param = field_param(tuple(first.get("loc", ())))
    kind = "unknown_field" if first.get("type") == "extra_forbidden" else "invalid_value"
    return ApiError(
        400,
        f"{param}: {first.get('msg')}" if param else first.get("msg", "invalid"),
        param=param,
        code=kind,
    )
