"""k8s_render: committed generated files match configs/, and overlays can resize but not rewrite
the Serve application."""

from __future__ import annotations

import shutil

import pytest
import yaml

from specserve.deploy import k8s_render

ROOT = k8s_render.ROOT


def test_generated_files_are_up_to_date():
    assert k8s_render.stale(ROOT) == [], "run: python -m specserve.deploy.k8s_render"
    assert k8s_render.main(["--check"]) == 0


def test_patch_carries_the_config_exactly():
    config = k8s_render.load_yaml(ROOT / "specserve" / "configs" / "serve.yaml")
    patch = yaml.safe_load(k8s_render.rayservice_patch(config, "specserve/configs/serve.yaml"))
    assert patch["kind"] == "RayService" and patch["metadata"]["name"] == "specserve"
    assert yaml.safe_load(patch["spec"]["serveConfigV2"]) == config


@pytest.fixture
def repo_copy(tmp_path):
    for part in ("specserve/configs", "k8s/base", "k8s/overlays"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def test_a_changed_config_makes_files_stale(repo_copy):
    serve = repo_copy / "specserve" / "configs" / "serve.yaml"
    serve.write_text(serve.read_text().replace("max_tokens: 1024", "max_tokens: 2048"))
    stale = {str(p) for p in k8s_render.stale(repo_copy)}
    assert stale == {
        "k8s/base/generated/serve-config.yaml",
        "k8s/overlays/prod/generated/serve-config.yaml",
    }
    assert k8s_render.main(["--check", "--root", str(repo_copy)]) == 1
    assert k8s_render.main(["--root", str(repo_copy)]) == 0
    assert k8s_render.stale(repo_copy) == []
    policy = repo_copy / "specserve" / "configs" / "policy.yaml"
    policy.write_text(policy.read_text() + "\nauto_train_extra: 1\n")
    assert [str(p) for p in k8s_render.stale(repo_copy)] == ["k8s/base/generated/policy.yaml"]


CONFIG = {
    "proxy_location": "EveryNode",
    "applications": [
        {
            "name": "app",
            "import_path": "m:f",
            "args": {"models": ["a"]},
            "deployments": [
                {"name": "Gateway", "autoscaling_config": {"min_replicas": 1, "max_replicas": 2}},
                {"name": "ModelServer-a", "ray_actor_options": {"num_cpus": 1}},
            ],
        }
    ],
}


def test_overrides_resize_deployments_deeply():
    out = k8s_render.apply_overrides(
        CONFIG,
        {
            "applications": [
                {
                    "name": "app",
                    "deployments": [
                        {"name": "Gateway", "autoscaling_config": {"max_replicas": 8}},
                        {
                            "name": "ModelServer-a",
                            "ray_actor_options": {"num_gpus": 1},
                            "max_ongoing_requests": 32,
                        },
                    ],
                }
            ]
        },
    )
    gateway, server = out["applications"][0]["deployments"]
    assert gateway["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 8}
    assert server == {
        "name": "ModelServer-a",
        "ray_actor_options": {"num_cpus": 1, "num_gpus": 1},
        "max_ongoing_requests": 32,
    }
    assert CONFIG["applications"][0]["deployments"][1] == {
        "name": "ModelServer-a",
        "ray_actor_options": {"num_cpus": 1},
    }


@pytest.mark.parametrize(
    "overrides",
    [
        {"proxy_location": "HeadOnly"},
        {"applications": [{"name": "app", "import_path": "other:f"}]},
        {"applications": [{"name": "app", "args": {"models": ["b"]}}]},
        {"applications": [{"name": "other", "deployments": []}]},
        {
            "applications": [
                {"name": "app", "deployments": [{"name": "Extra", "max_ongoing_requests": 1}]}
            ]
        },
        {
            "applications": [
                {"name": "app", "deployments": [{"name": "Gateway", "user_config": {}}]}
            ]
        },
    ],
)
def test_overrides_cannot_change_the_application(overrides):
    with pytest.raises(ValueError):
        k8s_render.apply_overrides(CONFIG, overrides)
