"""A tiny local stand-in for the gateway that the load scenarios run against (`fake_server`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeServer(ThreadingHTTPServer):
    """Streams `max_tokens` SSE chunks `chunk_s` apart (prompt "truncate": no final [DONE]);
    with `refuse_every` = n, every n-th POST gets 503 + Retry-After at once. Serves /healthz
    (in-flight streams) and /metrics (decoding = in-flight streams, 10 KV positions each)."""

    daemon_threads = True

    def __init__(self, chunk_s: float = 0.02, refuse_every: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.chunk_s, self.refuse_every = chunk_s, refuse_every
        self.lock = threading.Lock()
        self.posts = self.inflight = self.client_gone = self.strategy_puts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeHandler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: str, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body.encode())

    def do_GET(self) -> None:
        n = self.server.inflight
        if self.path == "/healthz":
            self._send(200, json.dumps({"status": "ok", "inflight": {"m": n}}), "application/json")
        elif self.path.split("?")[0] == "/admin/variants":
            self._send(200, json.dumps({"variants": [{"name": "load-0"}]}), "application/json")
        elif self.path == "/metrics":
            figures = {"decoding": n, "waiting": 0, "prefilling": 0, "kv_reserved_tokens": 10 * n}
            lines = [
                f'specserve_replica_batch{{base_model="m",figure="{f}",replica="m/0"}} {v}.0'
                for f, v in figures.items()
            ]
            self._send(200, "\n".join(lines) + "\n", "text/plain")
        else:
            self._send(404, "{}", "application/json")

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.strategy_puts += 1
        self._send(200, "{}", "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.posts += 1
            refuse = srv.refuse_every and srv.posts % srv.refuse_every == 0
            srv.inflight += not refuse
        if refuse:
            self._send(503, '{"error": "full"}', "application/json", {"Retry-After": "1"})
            return
        try:
            self._stream(body)
        except (BrokenPipeError, ConnectionResetError):
            with srv.lock:
                srv.client_gone += 1
        finally:
            with srv.lock:
                srv.inflight -= 1

    def _stream(self, body: dict) -> None:
        self._send(200, "", "text/event-stream")
        content = {"choices": [{"delta": {"content": "t"}}]}
        for _ in range(body["max_tokens"]):
            self.wfile.write(f"data: {json.dumps(content)}\n\n".encode())
            time.sleep(self.server.chunk_s)
        if body["messages"][0]["content"] != "truncate":
            usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@contextlib.contextmanager
def _serving(**kwargs):
    server = FakeServer(**kwargs)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake_server():
    """`with fake_server(chunk_s=..., refuse_every=...) as srv:` a FakeServer on a free port."""
    return _serving
