"""Outcome classification on real HTTP responses: the local SSE server of conftest.py answers each
prompt with one kind of body, read by `send_chat` over a real socket."""

from __future__ import annotations

import time

import pytest

from specserve.platform.api.http_client import ChatRequest
from specserve.platform.state.redis_server import free_port
from specserve.tools.faults.outcome import StreamState, send_chat

pytestmark = pytest.mark.timeout(60)


def _send(url: str, kind: str, deadline_s: float = 10.0):
    return send_chat(
        ChatRequest(url=url, model="m", prompt=kind, max_tokens=4, deadline_s=deadline_s)
    )


@pytest.mark.parametrize("kind", ["complete", "chunked_complete"])
def test_completed_needs_a_finish_chunk_and_done(sse_server, kind):
    result = _send(sse_server, kind)
    assert result.outcome == "completed", result
    assert result.status == 200 and result.tokens == 3 and result.version == 7
    assert result.first_token is not None and result.started <= result.first_token <= result.ended


def test_an_error_event_then_done_is_failed_with_error(sse_server):
    result = _send(sse_server, "error_event")
    assert result.outcome == "failed_with_error" and result.error_code == "replica_failed"
    assert result.tokens == 3


def test_an_http_error_json_is_failed_with_error_with_retry_after(sse_server):
    result = _send(sse_server, "http_error")
    assert (result.outcome, result.status, result.error_code) == (
        "failed_with_error",
        503,
        "overloaded",
    )
    assert result.retry_after == "1"


@pytest.mark.parametrize("kind", ["truncated", "cut_mid_chunk", "reset"])
def test_a_stream_ending_without_terminal_event_is_lost(sse_server, kind):
    result = _send(sse_server, kind)
    assert result.outcome == "lost", result
    assert result.tokens == 3


def test_a_stream_with_no_terminal_event_by_the_deadline_is_hung(sse_server):
    started = time.monotonic()
    result = _send(sse_server, "stall", deadline_s=1.0)
    assert result.outcome == "hung", result
    assert 0.9 < time.monotonic() - started < 5.0
    assert result.tokens == 3


@pytest.mark.parametrize("kind", ["bad_error", "done_no_finish", "not_json"])
def test_anything_else_is_malformed(sse_server, kind):
    assert _send(sse_server, kind).outcome == "malformed"


def test_no_listener_is_unreachable():
    result = _send(f"http://127.0.0.1:{free_port()}", "complete")
    assert result.outcome == "unreachable" and result.status is None


def test_the_state_is_filled_while_streaming(sse_server):
    state = StreamState()
    result = send_chat(
        ChatRequest(url=sse_server, model="m", prompt="complete", max_tokens=4), state
    )
    assert state.tokens == result.tokens == 3 and state.finished
