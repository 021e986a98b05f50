"""The suite's settings: scenario names (validated, run in the suite's order, graceful_stop last),
the `up`'s copy of a Serve config with overridden args, and the capacity read from a config."""

from __future__ import annotations

import pytest
import yaml

from specserve.cli import build_parser
from specserve.cli.faults import settings_of
from specserve.paths import config_file
from specserve.tools.faults import SCENARIOS, RunSettings
from specserve.tools.faults.capacity_faults import replica_capacity
from specserve.tools.faults.server import UpProcess, UpSettings, base_models, fault_config


def test_scenarios_run_in_the_suite_order_and_unknown_ones_are_refused():
    names = RunSettings(scenarios=["graceful_stop", "redis_kill", "replica_kill"]).ordered()
    assert names == ["replica_kill", "redis_kill", "graceful_stop"]
    assert list(SCENARIOS)[-1] == "graceful_stop"
    with pytest.raises(ValueError, match="unknown"):
        RunSettings(scenarios=["nope"]).ordered()


def test_the_cli_flags_become_the_run_settings():
    args = build_parser().parse_args(
        ["faults", "--scenarios", "redis_kill", "--streams", "3", "--max-tokens", "16"]
    )
    settings = settings_of(args)
    assert settings.scenarios == ["redis_kill"] and settings.max_tokens == 16
    assert settings.suite.streams == 3 and settings.config == config_file("serve.yaml")
    assert settings_of(build_parser().parse_args(["faults", "--url", "http://x:1"])).config is None


def test_the_ups_config_overrides_args_and_keeps_the_rest(tmp_path):
    written = fault_config(config_file("serve.yaml"), tmp_path / "c.yaml", {"engine_stall_s": 5})
    (app,) = yaml.safe_load(written.read_text())["applications"]
    assert app["args"]["engine_stall_s"] == 5
    assert app["args"]["models"] == ["smollm2-135m"] == base_models(written)
    assert {d["name"] for d in app["deployments"]} >= {"Gateway", "ModelServer-smollm2-135m"}


def test_the_ups_environment_has_fault_injection_and_no_outside_store(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:1/0")
    up = UpProcess(UpSettings(config=config_file("serve.yaml"), cache_dir=tmp_path, token="t"))
    env = up.environment()
    assert env["SPECSERVE_FAULT_INJECTION"] == "1" and env["SPECSERVE_ADMIN_TOKEN"] == "t"
    assert "REDIS_URL" not in env and env["SPECSERVE_CACHE"] == str(tmp_path)
    assert up.url.startswith("http://127.0.0.1:") and "--cache-dir" in up.command()


def test_capacity_of_the_packaged_config():
    held, how = replica_capacity(config_file("serve.yaml"), "smollm2-135m")
    (app,) = yaml.safe_load(config_file("serve.yaml").read_text())["applications"]
    batch = app["args"]["batch"]
    (server,) = [d for d in app["deployments"] if d["name"] == "ModelServer-smollm2-135m"]
    per_replica = min(server["max_ongoing_requests"], batch["max_batch"] + batch["max_queue"])
    assert held == per_replica + server["max_queued_requests"]
    assert "max_queued_requests" in how
