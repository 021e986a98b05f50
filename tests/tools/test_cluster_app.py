"""The demo deploys serve.yaml's application: same args and deployment options as `specserve up`,
only the model (a tiny one) and the ModelServer's two delays differ, as the demo's settings say."""

from __future__ import annotations

from pathlib import Path

from specserve.paths import config_file
from specserve.platform.rayserve.up import load_serve_config
from specserve.tools.cluster.app import SERVER, ScalingOverrides, serve_app_config, server_scaling


def test_same_application_only_the_delays_shortened(tmp_path: Path):
    args, deployments, _ = load_serve_config(config_file("serve.yaml"))
    scaling = ScalingOverrides(upscale_delay_s=3, downscale_delay_s=8)
    demo_args, demo_deployments = serve_app_config(tmp_path / "m", tmp_path / "a", scaling)
    kept = {k: v for k, v in args.items() if k not in demo_args or demo_args[k] == v}
    assert kept.keys() >= {"batch", "engine_stall_s", "retry_within_s", "max_body_bytes"}
    ours = {d["name"]: d for d in demo_deployments}
    theirs = {d["name"]: d for d in deployments}
    assert ours["Gateway"] == theirs["Gateway"]
    (original,) = [d for n, d in theirs.items() if n.startswith("ModelServer-")]
    demo = ours[SERVER]
    assert {k: v for k, v in demo.items() if k not in ("name", "autoscaling_config")} == {
        k: v for k, v in original.items() if k not in ("name", "autoscaling_config")
    }
    expected = original["autoscaling_config"] | {"upscale_delay_s": 3, "downscale_delay_s": 8}
    assert server_scaling(demo_deployments) == expected
    assert expected["max_replicas"] >= 2  # the demo needs room for a second replica


def test_no_override_keeps_serve_yamls_delays(tmp_path: Path):
    _, deployments, _ = load_serve_config(config_file("serve.yaml"))
    (original,) = [d for d in deployments if d["name"].startswith("ModelServer-")]
    _, demo = serve_app_config(tmp_path / "m", tmp_path / "a", ScalingOverrides())
    assert server_scaling(demo) == original["autoscaling_config"]
