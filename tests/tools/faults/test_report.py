"""Reports from real requests: `Streams`, `Load` and `first_success` against the local SSE server,
their results counted (`Counts`, error codes), and the JSON, text and Markdown renderings."""

from __future__ import annotations

import json
import time

import pytest

from specserve.tools.faults.context import build_report, first_error, no_broken
from specserve.tools.faults.report import Counts, FaultReport, SuiteReport, markdown, table
from specserve.tools.faults.traffic import Streams, Traffic, first_success, traffic_load

pytestmark = pytest.mark.timeout(60)
KINDS = ["complete", "error_event", "truncated", "http_error", "not_json"]


def _traffic(url: str, prompts: list[str]) -> Traffic:
    return Traffic(url=url, model="m", prompts=prompts, max_tokens=4, deadline_s=5.0)


def test_streams_are_counted_by_outcome(sse_server):
    traffic = _traffic(sse_server, KINDS)
    results = Streams([traffic.spec(i) for i in range(len(KINDS))]).start().join()
    counts = Counts.of(results)
    assert counts == Counts(sent=5, completed=1, failed_with_error=2, lost=1, malformed=1)
    assert not no_broken(counts)
    assert counts + counts == Counts(sent=10, completed=2, failed_with_error=4, lost=2, malformed=2)
    report = build_report("demo", results, [], time.monotonic() - 1, ok=False)
    assert report.error_codes == {"lost": 1, "malformed": 1, "overloaded": 1, "replica_failed": 1}
    assert first_error(results, min(r.started for r in results)) is not None
    assert first_error(results, time.monotonic()) is None


def test_wait_streaming_sees_streams_in_flight(sse_server):
    traffic = _traffic(sse_server, ["slow_complete"])
    streams = Streams([traffic.spec(i) for i in range(3)]).start()
    assert streams.wait_streaming(5.0) == 3
    assert streams.in_flight() == 3
    assert [r.outcome for r in streams.join()] == ["completed"] * 3


def test_load_is_bounded_and_first_success_times_a_completion(sse_server):
    load = traffic_load(
        _traffic(sse_server, ["complete", "error_event"]), workers=2, limit=6
    ).start()
    time.sleep(1.0)
    results = load.stop()
    assert len(results) == 6 and Counts.of(results).completed == 3
    since = time.monotonic()
    seconds, probes = first_success(_traffic(sse_server, ["error_event", "complete"]), since, 10)
    assert [p.outcome for p in probes] == ["failed_with_error", "completed"]
    assert 0 < seconds < 10
    never, tried = first_success(_traffic(sse_server, ["http_error"]), time.monotonic(), 0.6)
    assert never is None and tried and all(p.status == 503 for p in tried)


def test_table_markdown_and_json():
    good = FaultReport(
        scenario="redis_kill",
        ok=True,
        counts=Counts(sent=10, completed=9, failed_with_error=1),
        detect_s=0.4,
        detect_by="/healthz store down",
        recover_s=2.5,
        notes=["SIGKILL redis-server pid 1"],
    )
    bad = FaultReport(scenario="graceful_stop", ok=False, counts=Counts(sent=2, lost=1, hung=1))
    skipped = FaultReport(scenario="overload_3x", ok=False, skipped=True)
    suite = SuiteReport(url="http://127.0.0.1:1", model="tiny", reports=[good, bad, skipped])
    text = table(suite)
    assert "redis_kill" in text and "0.4 s (/healthz store down)" in text and "2.5 s" in text
    assert "redis_kill: SIGKILL redis-server pid 1" in text
    md = markdown(suite).splitlines()
    rows = [line for line in md if line.startswith("|")]
    assert rows[0].startswith("| scenario | ok | sent | done | error | lost | hung |")
    assert rows[1].replace(" ", "").strip("|").split("|") == ["---"] * 10
    assert rows[2].split(" | ")[1:6] == ["yes", "10", "9", "1", "0"]
    assert rows[3].split(" | ")[1] == "NO" and rows[4].split(" | ")[1] == "skipped"
    assert "- **redis_kill**: SIGKILL redis-server pid 1" in md
    again = SuiteReport.model_validate(json.loads(suite.model_dump_json()))
    assert again == suite
