import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specserve.tools import loadtest
from specserve.tools.loadtest import Level, Sample, percentile, summarize


def test_percentile_nearest_rank_against_reference():
    assert percentile([1, 2, 3, 4], 0.5) == 2 and percentile([1, 2, 3, 4], 0.99) == 4
    assert percentile([], 0.5) is None
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]
    for q in (0.1, 0.25, 0.5, 0.9, 0.99):
        ordered = sorted(values)
        reference = next(v for i, v in enumerate(ordered, 1) if i / len(ordered) >= q)
        assert percentile(values, q) == reference


def test_summarize_counts_failures_and_throughput():
    level = Level(
        [
            Sample(True, 10, 0.5, 0.1, 2.0),
            Sample(True, 30, 1.5, 0.2, 3.0),
            Sample(False, error="x"),
        ],
        4.0,
    )
    out = summarize(level)
    assert out["throughput_tok_s"] == 10.0 and out["failed"] == 1 and out["tau"] == 2.5
    assert (out["ttft_p50_s"], out["ttft_p99_s"]) == (0.5, 1.5)


def test_interleave_tasks_takes_each_task_in_turn():
    rows = [
        {"task": t, "turns": [f"{t}{i}"]}
        for t, i in [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    ]
    assert loadtest.interleave_tasks(rows) == ["a0", "b0", "c0", "a1", "c1"]


def test_level_requests_rounds_up_to_whole_task_cycles():
    """Every level gets whole cycles of the interleaved tasks (the same mix at every level)."""
    assert loadtest.level_requests(8, 3, 1, 6) == 12
    assert loadtest.level_requests(8, 3, 16, 6) == 48
    assert loadtest.level_requests(8, 3, 32, 6) == 96
    assert loadtest.level_requests(5, 1, 2, 1) == 5
    assert loadtest.level_requests(0, 0, 1, 0) == 1


# -- server figures, overload summary, plot (pure)

PROM = """\
# HELP specserve_replica_batch A replica's engine loop
# TYPE specserve_replica_batch gauge
specserve_replica_batch{base_model="m",figure="decoding",replica="m/0"} 3.0
specserve_replica_batch{base_model="m",figure="waiting",replica="m/0"} 2.0
specserve_replica_batch{base_model="m",figure="prefilling",replica="m/0"} 1.0
specserve_replica_batch{base_model="m",figure="kv_reserved_tokens",replica="m/0"} 640.0
specserve_replica_batch{base_model="m",figure="draft_cap",replica="m/0"} -1.0
specserve_replica_batch{base_model="m",figure="decoding",replica="m/1"} 4.0
specserve_replica_batch{base_model="m",figure="waiting",replica="m/1"} -1.0
specserve_replica_batch{base_model="m",figure="kv_reserved_tokens",replica="m/1"} 900.0
specserve_replica_ongoing{base_model="m",replica="m/0"} 3.0
specserve_requests_total{base_model="m",note="say \\"hi\\", ok"} 7.0
specserve_store_up 1.0
"""


def test_prom_values_filters_by_name_and_label_subset():
    decoding = loadtest.prom_values(PROM, "specserve_replica_batch", {"figure": "decoding"})
    assert decoding == [3.0, 4.0]
    only_m0 = {"figure": "decoding", "replica": "m/0"}
    assert loadtest.prom_values(PROM, "specserve_replica_batch", only_m0) == [3.0]
    assert loadtest.prom_values(PROM, "specserve_replica_ongoing") == [3.0]
    assert loadtest.prom_values(PROM, "specserve_store_up") == [1.0]
    assert loadtest.prom_values(PROM, "specserve_replica") == []  # a prefix is not a match
    quoted = {"note": 'say "hi", ok'}
    assert loadtest.prom_values(PROM, "specserve_requests_total", quoted) == [7.0]


def test_batch_active_and_kv_reserved_skip_unknown_figures():
    assert loadtest.batch_active(PROM) == 3.0 + 2.0 + 1.0 + 4.0  # waiting -1 on m/1 skipped
    assert loadtest.kv_reserved(PROM) == 900.0
    assert loadtest.kv_reserved("specserve_store_up 1.0\n") is None
    assert loadtest.batch_active("") == 0


def _engine_prom(steps, rows, decode_s, tokens, prefill_s, replica="m/0") -> str:
    figures = {
        "decode_steps": steps,
        "decode_rows": rows,
        "decode_seconds": decode_s,
        "prefill_tokens": tokens,
        "prefill_seconds": prefill_s,
    }
    return "".join(
        f'specserve_replica_batch{{base_model="m",figure="{f}",replica="{replica}"}} {v}\n'
        for f, v in figures.items()
    )


def test_engine_share_of_a_level_from_figures_scraped_around_it():
    before = loadtest.engine_figures(_engine_prom(10, 100, 1.0, 500, 1.0))
    after = loadtest.engine_figures(
        _engine_prom(60, 500, 7.0, 2000, 2.0) + _engine_prom(50, 700, 6.0, 2000, 3.5, "m/1")
    )
    assert after == {
        "decode_steps": 110.0,
        "decode_rows": 1200.0,
        "decode_seconds": 13.0,
        "prefill_tokens": 4000.0,
        "prefill_seconds": 5.5,
    }
    # two replicas over 20 s: 100 decode steps of 11 rows in 12 s, 3,500 prompt tokens in 4.5 s
    share = loadtest.engine_share(before, after, 20.0)
    assert share == {
        "busy_fraction": 0.825,
        "decode_steps": 100,
        "rows_per_step": 11.0,
        "decode_ms_per_step": 120.0,
        "prefill_ms_per_token": 1.29,
        "prefill_fraction": 0.225,
    }
    idle = loadtest.engine_share(after, after, 5.0)
    assert idle["decode_steps"] == 0 and idle["rows_per_step"] is None
    assert idle["prefill_ms_per_token"] is None and idle["busy_fraction"] == 0.0


def test_engine_figures_unknown_when_a_figure_is_missing():
    assert loadtest.engine_figures(None) is None
    assert loadtest.engine_figures(PROM) is None  # an older server: no engine figures
    assert loadtest.engine_share(None, {}, 1.0) is None


def test_summarize_overload_counts_percentiles_and_retry_after():
    Attempt = loadtest.Attempt
    attempts = [
        Attempt("completed", True),
        Attempt("completed", True),
        Attempt("failed", True, error="no [DONE]"),
        Attempt("failed", error="HTTP 500"),
        *[
            Attempt("refused", refused_s=s, retry_after=s < 0.04, refused_by=by)
            for s, by in (
                (0.01, "gateway"),
                (0.02, "gateway"),
                (0.03, "gateway"),
                (0.05, "replica"),
            )
        ],
    ]
    out = loadtest.summarize_overload(attempts)
    assert out["refused_by"] == {
        "gateway": {"count": 3, "latency_p50_s": 0.02, "latency_p99_s": 0.03},
        "replica": {"count": 1, "latency_p50_s": 0.05, "latency_p99_s": 0.05},
    }
    assert (out["admitted"], out["completed"], out["refused"], out["failed"]) == (3, 2, 4, 2)
    assert (out["refused_latency_p50_s"], out["refused_latency_p99_s"]) == (0.02, 0.05)
    assert out["refused_latency_max_s"] == 0.05 and out["retry_after_present"] == 0.75
    empty = loadtest.summarize_overload([Attempt("completed", True)])
    assert empty["refused"] == 0 and empty["retry_after_present"] is None
    assert empty["refused_latency_p50_s"] is None and empty["refused_latency_max_s"] is None


def test_seconds_to_zero_per_probe_and_gives_up():
    readings = iter([2, 1, 0])
    out = loadtest.seconds_to_zero(
        {"drains": lambda: next(readings), "stuck": lambda: None}, poll_s=0.01, limit_s=0.1
    )
    assert out["drains"] is not None and 0.015 <= out["drains"] < 0.1
    assert out["stuck"] is None


def test_plot_writes_a_small_png(tmp_path):
    def level(tok_s, itl):
        return {"throughput_tok_s": tok_s, "itl_p50_s": itl}

    report = {
        "results": {
            "ar": {"1": level(20.0, 0.05), "2": level(35.0, 0.06), "4": level(50.0, 0.08)},
            "policy": {"1": level(30.0, 0.03), "4": level(70.0, None)},
        }
    }
    path = tmp_path / "load.png"
    loadtest.plot(report, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000


# -- overload and disconnect clients against a tiny local server


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
def fake_server(**kwargs):
    server = FakeServer(**kwargs)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_attempt_chat_classifies_completed_truncated_refused_and_unreachable():
    with fake_server(refuse_every=3) as srv:
        done = loadtest.attempt_chat(srv.url, "m", "hi", 3, timeout=5)
        truncated = loadtest.attempt_chat(srv.url, "m", "truncate", 3, timeout=5)
        refused = loadtest.attempt_chat(srv.url, "m", "hi", 3, timeout=5)
        port = srv.server_address[1]
    assert (done.status, done.admitted) == ("completed", True)
    assert (truncated.status, truncated.admitted, truncated.error) == ("failed", True, "no [DONE]")
    assert refused.status == "refused" and refused.retry_after and refused.refused_s < 1.0
    gone = loadtest.attempt_chat(f"http://127.0.0.1:{port}", "m", "hi", 3, timeout=5)
    assert (gone.status, gone.admitted) == ("failed", False) and gone.error


def test_run_overload_end_to_end_against_fake_server():
    with fake_server(refuse_every=2) as srv:
        out = loadtest.run_overload(
            srv.url, ["m", "m2"], ["a", "b", "c"], 4, 1.0, 5, timeout=10, kv_poll_s=0.2
        )
        posts = srv.posts
    assert out["clients"] == 4 and out["seconds"] == 1.0 and 1.0 <= out["wall_s"] < 3.0
    assert out["refused"] > 0 and out["completed"] > 0 and out["failed"] == 0
    assert out["admitted"] == out["completed"]
    assert out["completed"] + out["refused"] == posts
    assert out["retry_after_present"] == 1.0 and out["refused_latency_max_s"] < 1.0
    assert out["refused_latency_p50_s"] <= out["refused_latency_p99_s"]
    assert list(out["refused_by"]) == ["replica"]  # the fake's body is not the gateway's
    assert out["refused_by"]["replica"]["count"] == out["refused"]
    assert out["inflight_after_s"] is not None and out["inflight_after_s"] < 1.0
    assert out["kv_reserved_tokens_before"] == 0.0 and out["kv_reserved_tokens_after"] == 0.0
    assert out["kv_reserved_tokens_max"] >= 10.0


def test_run_overload_from_several_client_processes():
    """Clients split over 2 spawned processes: every attempt of each process is counted."""
    with fake_server(refuse_every=3) as srv:
        out = loadtest.run_overload(
            srv.url, ["m"], ["a", "b"], 3, 0.5, 5, timeout=10, kv_poll_s=0.2, processes=2
        )
        posts = srv.posts
    assert (out["clients"], out["processes"]) == (3, 2)
    assert out["refused"] > 0 and out["completed"] > 0 and out["failed"] == 0
    assert out["completed"] + out["refused"] == posts


def test_run_disconnect_end_to_end_against_fake_server():
    with fake_server() as srv:
        out = loadtest.run_disconnect(srv.url, ["m"], ["hi"], 3, 2, 200, timeout=10, limit_s=3)
        gone = srv.client_gone
    assert (out["streams"], out["after_tokens"], out["cut"]) == (3, 2, 3)
    assert out["active_before_cut"] == 3.0 and gone == 3
    assert out["seconds_to_zero_inflight"] is not None and out["seconds_to_zero_inflight"] < 1.0
    assert out["seconds_to_zero_active"] is not None and out["seconds_to_zero_active"] < 1.0


def test_run_disconnect_counts_only_streams_it_cut():
    with fake_server(refuse_every=2) as srv:  # one of two refused; short streams end first
        refused = loadtest.run_disconnect(srv.url, ["m"], ["hi"], 2, 3, 200, timeout=10)
    with fake_server() as srv:
        short = loadtest.run_disconnect(srv.url, ["m"], ["hi"], 2, 3, 1, timeout=10)
    assert refused["cut"] == 1 and short["cut"] == 0
    assert short["seconds_to_zero_inflight"] is not None


def test_cli_loadtest_flags_default_off():
    from specserve.cli import build_parser

    args = build_parser().parse_args(["loadtest"])
    assert (args.plot, args.overload_factor, args.disconnect) == (None, 0.0, 0)
    assert (args.overload_seconds, args.overload_capacity, args.disconnect_after) == (20.0, None, 3)
    assert args.overload_processes == 4
    args = build_parser().parse_args(
        ["loadtest", "--plot", "x.png", "--overload-factor", "1.5", "--disconnect", "8"]
    )
    assert (str(args.plot), args.overload_factor, args.disconnect) == ("x.png", 1.5, 8)


def test_cli_loadtest_writes_overload_disconnect_and_plot(tmp_path):
    from specserve.cli import main

    data, out, png = tmp_path / "p.jsonl", tmp_path / "load.json", tmp_path / "load.png"
    data.write_text(json.dumps({"turns": ["hi"]}) + "\n")
    flags = "--variants 1 --concurrency 1,2 --requests 2 --modes policy --max-tokens 3"
    flags += " --overload-factor 1 --overload-seconds 0.3 --disconnect 2 --disconnect-after 2"
    with fake_server() as srv:
        argv = ["loadtest", "--url", srv.url, "--token", "t", *flags.split()]
        assert main([*argv, "--data", str(data), "--out", str(out), "--plot", str(png)]) == 0
        puts = srv.strategy_puts
    report = json.loads(out.read_text())
    assert set(report["results"]["policy"]) == {"1", "2"} and puts == 2  # forced, then reset
    assert report["engine"]["policy"] == {"1": None, "2": None}  # the fake server has none
    assert report["overload"]["clients"] == 2 and report["overload"]["completed"] > 0
    assert report["overload"]["failed"] == 0 and report["overload"]["refused"] == 0
    assert report["disconnect"]["streams"] == 2 and report["disconnect"]["cut"] == 2
    assert report["plot"] == str(png) and png.stat().st_size < 100_000
