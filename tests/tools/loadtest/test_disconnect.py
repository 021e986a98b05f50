"""Tests for specserve.tools.loadtest.disconnect: streams cut after a few tokens, and the drain."""

from specserve.tools.loadtest import disconnect
from specserve.tools.loadtest.client import Traffic


def _traffic(url: str, max_tokens: int) -> Traffic:
    return Traffic(url=url, models=["m"], prompts=["hi"], max_tokens=max_tokens, timeout=10)


def test_run_disconnect_end_to_end_against_fake_server(fake_server):
    with fake_server() as srv:
        out = disconnect.run_disconnect(_traffic(srv.url, 200), 3, 2, limit_s=3)
        gone = srv.client_gone
    assert (out["streams"], out["after_tokens"], out["cut"]) == (3, 2, 3)
    assert out["active_before_cut"] == 3.0 and gone == 3
    assert out["seconds_to_zero_inflight"] is not None and out["seconds_to_zero_inflight"] < 1.0
    assert out["seconds_to_zero_active"] is not None and out["seconds_to_zero_active"] < 1.0


def test_run_disconnect_counts_only_streams_it_cut(fake_server):
    with fake_server(refuse_every=2) as srv:  # one of two refused; short streams end first
        refused = disconnect.run_disconnect(_traffic(srv.url, 200), 2, 3)
    with fake_server() as srv:
        short = disconnect.run_disconnect(_traffic(srv.url, 1), 2, 3)
    assert refused["cut"] == 1 and short["cut"] == 0
    assert short["seconds_to_zero_inflight"] is not None
