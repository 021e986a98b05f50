"""Tests for specserve.platform.api.http_client (the SSE reader, plain calls, a stream's deadline)
and AdminClient's errors over it, against a local stdlib HTTP server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from specserve.platform.api.client import AdminClient
from specserve.platform.api.http_client import (
    ChatRequest,
    get_json,
    get_text,
    has_content,
    open_chat,
    send,
    sse_events,
)
from specserve.platform.state.redis_server import free_port

pytestmark = pytest.mark.timeout(60)


class Handler(BaseHTTPRequestHandler):
    """GET /ok: JSON; /admin/missing: an OpenAI error JSON 404; POST: one chunk, then a stall."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ok":
            self._answer(200, b'{"status": "ok"}')
        elif self.path == "/admin/missing":
            self._answer(404, b'{"error": {"message": "no such variant"}}')
        else:
            self._answer(500, b"<html>oops</html>")

    def do_POST(self) -> None:
        seen = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(seen)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = b'data: {"choices": [{"delta": {"content": "t"}}]}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.flush()
        self.server.release.wait(10)
        self.close_connection = True


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads, srv.release, srv.bodies = True, threading.Event(), []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def test_sse_events_reads_data_lines_and_done():
    lines = ['data: {"choices": [{"delta": {"content": "t"}}]}', "", ": ping", "data:[DONE]"]
    events = list(sse_events(lines))
    assert len(events) == 2 and has_content(events[0]) and events[1] == "DONE"
    assert not has_content("DONE") and not has_content({"choices": [], "usage": {}})
    with pytest.raises(ValueError):
        list(sse_events(["data: [1, 2]"]))
    with pytest.raises(ValueError):
        list(sse_events(["data: {oops"]))


def test_plain_calls_raise_or_answer_none_on_failure(server):
    assert get_json(server.url + "/ok") == {"status": "ok"}
    assert get_text(server.url + "/other") is None and get_json(server.url + "/other") is None
    assert get_text(f"http://127.0.0.1:{free_port()}/ok") is None
    with pytest.raises(httpx.HTTPStatusError):
        send("GET", server.url + "/other")


def test_admin_client_errors_name_the_call_and_the_server(server):
    with pytest.raises(ValueError, match=r"GET /missing: HTTP 404: no such variant"):
        AdminClient(server.url, "t").call("GET", "/missing")
    unreachable = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=f"cannot reach {unreachable}"):
        AdminClient(unreachable, "t").call("GET", "/variants")


def test_a_stream_is_cut_at_its_deadline(server):
    request = ChatRequest(url=server.url, model="m", prompt="p", max_tokens=4, deadline_s=1.0)
    started, seen = time.monotonic(), []
    with pytest.raises(httpx.ReadTimeout), open_chat(request) as stream:
        assert stream.status == 200
        seen.extend(stream.events())
    assert 0.9 < time.monotonic() - started < 5.0 and len(seen) == 1
    assert server.bodies[-1]["ignore_eos"] is False and server.bodies[-1]["stream"] is True
