"""The `disconnect` report: streams cut abruptly after a few tokens; how long until the gateway's
in-flight count and the replicas' batch (decoding + waiting + prefilling) reach zero."""

from __future__ import annotations

import threading
import time

from specserve.platform.api.http_client import (
    REQUEST_ERRORS,
    ChatRequest,
    ChatStream,
    has_content,
    open_chat,
)
from specserve.tools.loadtest.client import Traffic, running
from specserve.tools.loadtest.probes import gateway_inflight, replica_active, seconds_to_zero


def _content_chunks(stream: ChatStream, after: int) -> int:
    """Content chunks read from a stream, stopping at `after` or at its `[DONE]`."""
    seen = 0
    if stream.status == 200:
        for event in stream.events():
            seen += has_content(event)
            if seen >= after or event == "DONE":
                break
    return seen


def cut_stream(
    request: ChatRequest, after: int, ready: threading.Event, go: threading.Event
) -> bool:
    """Read `after` content chunks, set `ready`, wait for `go`, then shut the socket down hard.

    True when the stream was cut after `after` chunks (not refused, failed or finished early).
    """
    try:
        with open_chat(request) as stream:  # the connection closes on leaving
            if _content_chunks(stream, after) < after:
                return False
            ready.set()
            go.wait(request.deadline_s)
            stream.cut()
            return True
    except REQUEST_ERRORS:
        return False
    finally:
        ready.set()


def run_disconnect(
    traffic: Traffic, streams: int, after: int, poll_s: float = 0.05, limit_s: float = 30.0
) -> dict:
    """The `disconnect` report: `streams` of `traffic` opened at once (each given its timeout to
    reach `after` chunks), cut together after `after` chunks."""
    url = traffic.url
    go, readies, cut = threading.Event(), [threading.Event() for _ in range(streams)], []

    def stream(i: int) -> None:
        cut.append(cut_stream(traffic.request(i), after, readies[i], go))

    with running(stream, streams):
        deadline = time.perf_counter() + traffic.timeout
        for ready in readies:
            ready.wait(max(0.0, deadline - time.perf_counter()))
        active_before = replica_active(url)
        go.set()
        cut_at = time.perf_counter()
    probes = {"inflight": lambda: gateway_inflight(url), "active": lambda: replica_active(url)}
    zero = seconds_to_zero(probes, poll_s, limit_s, started=cut_at)
    return {
        "streams": streams,
        "after_tokens": after,
        "cut": sum(cut),
        "seconds_to_zero_inflight": zero["inflight"],
        "seconds_to_zero_active": zero["active"],
        "active_before_cut": active_before,
    }
