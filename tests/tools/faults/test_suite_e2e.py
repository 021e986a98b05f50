"""The suite end to end: `specserve faults` starts its own `specserve up` (tiny float32 model,
loopback, a tmp cache), runs engine_loop_kill and redis_kill with 3 streams, writes the JSON and
Markdown reports and stops the `up`; no request may be lost, hung or malformed."""

from __future__ import annotations

import psutil
import pytest
from e2e.upstack import tiny_serve_config

from specserve.cli import main
from specserve.tools.faults import SuiteReport

pytestmark = pytest.mark.timeout(420)


def test_engine_loop_kill_and_redis_kill_lose_no_request(tmp_path, save_tiny_model_dir):
    model_dir = save_tiny_model_dir(tmp_path / "model")
    config = tiny_serve_config(tmp_path / "serve.yaml", model_dir, max_tokens=240)
    out, md = tmp_path / "faults.json", tmp_path / "faults.md"
    flags = ["--config", str(config), "--cache-dir", str(tmp_path / "cache"), "--num-cpus", "2"]
    flags += ["--scenarios", "redis_kill,engine_loop_kill", "--streams", "3", "--after", "2"]
    flags += ["--max-tokens", "200", "--window-s", "3", "--recover-limit-s", "60"]
    flags += ["--start-timeout-s", "180"]
    code = main(["faults", *flags, "--out", str(out), "--markdown", str(md)])

    suite = SuiteReport.model_validate_json(out.read_text())
    by_name = {r.scenario: r for r in suite.reports}
    assert list(by_name) == ["engine_loop_kill", "redis_kill"]  # the suite's order
    for report in suite.reports:
        counts = report.counts
        assert counts.lost == counts.hung == counts.malformed == 0, report
        assert counts.sent >= 3 and counts.completed + counts.failed_with_error == counts.sent
        assert report.recover_s is not None, report
    kill = by_name["engine_loop_kill"]
    assert "engine loop thread killed" in kill.notes[0]
    assert kill.figures["streaming_at_fault"] >= 1
    assert kill.figures["replica_replaced_s"] is not None  # a dead loop: Serve replaces it
    redis = by_name["redis_kill"]
    assert redis.notes[0].startswith("SIGKILL redis-server pid")
    assert redis.figures["redis_restarted_s"] is not None
    assert code == 0, suite.model_dump_json(indent=1)
    assert "| engine_loop_kill | yes |" in md.read_text()
    assert psutil.Process().children(recursive=True) == []  # the `up` and its Ray are gone
