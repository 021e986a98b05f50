"""A local SSE server on 127.0.0.1 (`sse_server`): each prompt names the body it gets (complete,
an SSE error event, truncated, cut mid-chunk, reset, stalled, an error JSON, a non-OpenAI error,
[DONE] without a finish chunk); `slow_complete` streams 3 tokens 0.2 s apart, then completes."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


def _chunk(text: str | None, finish: str | None = None, extra: dict | None = None) -> bytes:
    delta = {"content": text} if text else {}
    event = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]} | (extra or {})
    return f"data: {json.dumps(event)}\n\n".encode()


TOKENS = b"".join(_chunk(f"t{i} ") for i in range(3))
FINISH = _chunk(None, "length", {"specserve": {"version": 7}})
DONE = b"data: [DONE]\n\n"
ERROR = b'data: {"error": {"message": "replica died", "type": "server_error", "code": "replica_failed"}}\n\n'
BODIES = {
    "complete": TOKENS + FINISH + DONE,
    "error_event": TOKENS + ERROR + DONE,
    "truncated": TOKENS,
    "done_no_finish": TOKENS + DONE,
    "not_json": TOKENS + b"data: {oops\n\n",
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = body["messages"][0]["content"]
        if kind == "http_error":
            self._plain(503, b'{"error": {"message": "full", "code": "overloaded"}}', "1")
        elif kind == "bad_error":
            self._plain(502, b"<html>bad gateway</html>")
        elif kind in BODIES:  # no length, no chunking: the body ends when the connection closes
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(BODIES[kind])
            self.close_connection = True
        else:
            self._chunked(kind)

    def _plain(self, status: int, body: bytes, retry_after: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(body)

    def _chunked(self, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            piece = _chunk(f"t{i} ")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            if kind == "slow_complete":
                time.sleep(0.2)
        if kind in ("chunked_complete", "slow_complete"):
            for piece in (FINISH, DONE):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif kind == "cut_mid_chunk":
            self.wfile.write(b"40\r\ndata: {")  # promises 64 bytes, sends 7, closes
            self.close_connection = True
        elif kind == "reset":  # RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
        elif kind == "stall":
            self.server.release.wait(10)
            self.close_connection = True


@pytest.fixture(scope="module")
def sse_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.release = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.release.set()
    srv.shutdown()
    srv.server_close()
