"""Drain for real: SIGTERM to a running `specserve up` (tiny model, local Ray, embedded redis)
with streams in flight — they all finish whole, requests sent after it get 503 shutting_down
with Retry-After, and `up` exits 0 once they are done, well within shutdown_timeout_s."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from e2e.upstack import running_up, tiny_serve_config

pytestmark = pytest.mark.timeout(400)
MAX_TOKENS = 240
STREAMS = 3
SHUTDOWN_TIMEOUT_S = 40


def _body(stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "w5 w9 w14 w3"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }


class Stream(threading.Thread):
    """One streamed chat read line by line; `first` is set at its first content chunk."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.first, self.payloads, self.error = base_url, threading.Event(), [], None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", f"{self.base_url}/v1/chat/completions", json=_body(True), timeout=120
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.payloads.append(line.removeprefix("data: "))
                        if '"content":"w' in line or len(self.payloads) > 2:
                            self.first.set()
        except httpx.HTTPError as err:  # a reset: what the drain must prevent
            self.error = err
        finally:
            self.first.set()


def test_sigterm_lets_in_flight_streams_finish_and_refuses_new_requests(
    tmp_path, save_tiny_model_dir
):
    model_dir = save_tiny_model_dir(tmp_path / "model")
    config = tiny_serve_config(
        tmp_path / "serve.yaml", model_dir, shutdown_timeout_s=SHUTDOWN_TIMEOUT_S
    )
    with running_up(config, tmp_path / "cache", tmp_path / "up.log") as up:
        streams = [Stream(up.base_url) for _ in range(STREAMS)]
        for stream in streams:
            stream.start()
        assert all(s.first.wait(60) for s in streams)
        up.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        refused, answers = None, []
        while refused is None and time.monotonic() - signalled < 10:
            try:
                # a short probe: one admitted before the gateway saw the drain ends at once
                reply = httpx.post(
                    f"{up.base_url}/v1/chat/completions", json=_body(False, 2), timeout=60
                )
            except httpx.HTTPError as err:
                answers.append(f"{time.monotonic() - signalled:.2f}s {err!r}")
                continue
            answers.append(f"{time.monotonic() - signalled:.2f}s {reply.status_code}")
            if reply.status_code == 503:
                refused = reply
            time.sleep(0.1)  # admitted before the gateway saw the drain (<= 0.25 s): it finishes
        for stream in streams:
            stream.join(120)
        rc = up.proc.wait(SHUTDOWN_TIMEOUT_S + 30)
        stopped_s = time.monotonic() - signalled
        log = up.log_text()
    assert refused is not None and all(a.endswith(("200", "503")) for a in answers), (
        answers,
        [len(s.payloads) for s in streams],
        log[-3000:],
    )
    assert refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["code"] == "shutting_down"
    for stream in streams:
        drain_lines = [line for line in log.splitlines() if "drain" in line or "stopp" in line]
        assert stream.error is None, (stream.error, len(stream.payloads), drain_lines)
        assert stream.payloads[-1] == "[DONE]"
        usage = json.loads(stream.payloads[-2])["usage"]
        finish = [json.loads(p)["choices"][0]["finish_reason"] for p in stream.payloads[1:-2]]
        assert usage["completion_tokens"] == MAX_TOKENS and finish[-1] == "length"
    assert rc == 0, log[-3000:]
    assert "drained in" in log and "cut with an error event" not in log
    assert stopped_s < SHUTDOWN_TIMEOUT_S  # it stopped once the streams ended, not at the timeout
