"""The gateway's refusals as OpenAI errors: `at_capacity` (503 overloaded), `broken` (a variant
whose adapter changed after registration), and `first_event`, which maps what a model server raised
before its first event (overload, an adapter it cannot load, a prompt it cannot take, a replica
lost) to an ApiError before any byte is sent, logging the full text under the request id.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from specserve.adapters.errors import AdapterCapacityError, AdapterError
from specserve.platform.api.errors import ApiError, short_message, underlying
from specserve.platform.api.openai_api import ChatCompletionRequest, CompletionRequest
from specserve.platform.api.shaping import stream_failure
from specserve.platform.backend import Overloaded
from specserve.platform.events import Delta, Done
from specserve.platform.requests import Target
from specserve.platform.service import ReplicaLost

log = logging.getLogger(__name__)

DIGEST_MISMATCH = "adapter_digest_mismatch"
BROKEN_REASON = "its adapter's files changed after registration (sha256 mismatch)"


def broken(target: Target) -> ApiError:
    message = f"variant {target.key} is broken: {target.broken}; register a new version"
    return ApiError(500, message, "server_error", code=DIGEST_MISMATCH)


def at_capacity(what: str) -> ApiError:
    return ApiError(
        503,
        f"{what} is at capacity; retry shortly",
        "overloaded_error",
        code="overloaded",
        headers={"Retry-After": "1"},
    )


def prompt_field(req: CompletionRequest | ChatCompletionRequest) -> str:
    return "messages" if isinstance(req, ChatCompletionRequest) else "prompt"


class Refusal:
    """Maps what a model server raised before its first event to an ApiError (None: not a
    refusal, the 500 handler answers), by the underlying cause, logging the full text."""

    def __init__(self, base_model: str, prompt_field: str, request_id: str) -> None:
        self.base_model, self.prompt_field, self.request_id = base_model, prompt_field, request_id

    def of(self, err: Exception) -> ApiError | None:
        cause = underlying(err)
        if isinstance(err, Overloaded) or isinstance(cause, Overloaded):
            api = at_capacity(self.base_model)
        elif isinstance(cause, AdapterCapacityError):
            retry = {"Retry-After": "1"}
            api = ApiError(
                503, short_message(cause), "overloaded_error", code=cause.code, headers=retry
            )
        elif isinstance(cause, AdapterError):
            message = f"variant adapter unavailable ({cause.code}); details in the server log"
            api = ApiError(500, message, "server_error", code=cause.code)
        elif isinstance(cause, ValueError):
            api = self._invalid(short_message(cause))
        else:
            return None
        log.info("%s: %s %s: %s", self.request_id, api.status, api.code, err)
        return api

    def _invalid(self, message: str) -> ApiError:
        """400; a prompt the model cannot take (empty, longer than its context) names the prompt."""
        if message.startswith(("prompt", "request needs")):
            return ApiError(400, message, param=self.prompt_field, code="invalid_prompt")
        return ApiError(400, message, code="invalid_value")


async def first_event(events: AsyncIterator[Delta | Done], refusal: Refusal) -> Delta | Done:
    """The first event, mapping the model server's refusals to API errors before any byte is
    sent; a replica lost before it (and again on the one retry) answers 503."""
    try:
        return await anext(events)
    except ReplicaLost as err:
        raise stream_failure(err, refusal.request_id) from None
    except Exception as err:
        api = refusal.of(err)
        if api is None:
            raise
        raise api from None
