"""Tests for specserve.tools.loadtest.overload: attempts classified and summarized, end to end
against the fake server, from one or several client processes."""

from specserve.platform.api.http_client import ChatRequest
from specserve.tools.loadtest import overload
from specserve.tools.loadtest.client import Traffic


def test_summarize_overload_counts_percentiles_and_retry_after():
    Attempt = overload.Attempt
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
    out = overload.summarize_overload(attempts)
    assert out["refused_by"] == {
        "gateway": {"count": 3, "latency_p50_s": 0.02, "latency_p99_s": 0.03},
        "replica": {"count": 1, "latency_p50_s": 0.05, "latency_p99_s": 0.05},
    }
    assert (out["admitted"], out["completed"], out["refused"], out["failed"]) == (3, 2, 4, 2)
    assert (out["refused_latency_p50_s"], out["refused_latency_p99_s"]) == (0.02, 0.05)
    assert out["refused_latency_max_s"] == 0.05 and out["retry_after_present"] == 0.75
    empty = overload.summarize_overload([Attempt("completed", True)])
    assert empty["refused"] == 0 and empty["retry_after_present"] is None
    assert empty["refused_latency_p50_s"] is None and empty["refused_latency_max_s"] is None


def test_attempt_chat_classifies_completed_truncated_refused_and_unreachable(fake_server):
    with fake_server(refuse_every=3) as srv:
        hi = ChatRequest(url=srv.url, model="m", prompt="hi", max_tokens=3, deadline_s=5)
        done = overload.attempt_chat(hi)
        truncated = overload.attempt_chat(hi.model_copy(update={"prompt": "truncate"}))
        refused = overload.attempt_chat(hi)
        port = srv.server_address[1]
    assert (done.status, done.admitted) == ("completed", True)
    assert (truncated.status, truncated.admitted, truncated.error) == ("failed", True, "no [DONE]")
    assert refused.status == "refused" and refused.retry_after and refused.refused_s < 1.0
    gone = overload.attempt_chat(hi.model_copy(update={"url": f"http://127.0.0.1:{port}"}))
    assert (gone.status, gone.admitted) == ("failed", False) and gone.error


def test_run_overload_end_to_end_against_fake_server(fake_server):
    with fake_server(refuse_every=2) as srv:
        traffic = Traffic(
            url=srv.url, models=["m", "m2"], prompts=["a", "b", "c"], max_tokens=5, timeout=10
        )
        out = overload.run_overload(traffic, 4, 1.0, kv_poll_s=0.2)
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


def test_run_overload_from_several_client_processes(fake_server):
    """Clients split over 2 spawned processes: every attempt of each process is counted."""
    with fake_server(refuse_every=3) as srv:
        traffic = Traffic(url=srv.url, models=["m"], prompts=["a", "b"], max_tokens=5, timeout=10)
        out = overload.run_overload(traffic, 3, 0.5, kv_poll_s=0.2, processes=2)
        posts = srv.posts
    assert (out["clients"], out["processes"]) == (3, 2)
    assert out["refused"] > 0 and out["completed"] > 0 and out["failed"] == 0
    assert out["completed"] + out["refused"] == posts
