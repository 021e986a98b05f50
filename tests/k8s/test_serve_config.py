"""specserve/configs/serve.yaml (and each overlay's resized copy) is a valid Ray Serve config, checked with
Ray's own schema plus unknown-key detection, and keeps the platform's contract (see its header)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import ServeDeploySchema

from scripts.k8s_validate.render import overlays
from specserve.deploy import k8s_render
from specserve.platform.settings import PlatformSettings

ROOT = k8s_render.ROOT
CONFIGS = {
    "specserve/configs/serve.yaml": k8s_render.load_yaml(
        ROOT / "specserve" / "configs" / "serve.yaml"
    )
}
CONFIGS.update({f"overlay {o}": k8s_render.overlay_serve_config(ROOT, o) for o in overlays()})


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def unknown_keys(model: type[BaseModel], data: dict, where: str = "") -> list[str]:
    """Keys Ray's schema would silently accept and ignore (its models allow extra fields)."""
    problems = []
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    fields.update(model.model_fields)
    for key, value in data.items():
        if key not in fields:
            problems.append(f"{where}{key}: not a field of {model.__name__}")
            continue
        for sub in _models_in(fields[key].annotation)[:1]:
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if isinstance(item, dict):
                    at = f"{where}{key}[{i}]." if isinstance(value, list) else f"{where}{key}."
                    problems += unknown_keys(sub, item, at)
    return problems


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_valid_for_ray_serve(name):
    config = CONFIGS[name]
    schema = ServeDeploySchema.model_validate(config)
    assert unknown_keys(ServeDeploySchema, config) == []
    for app in schema.applications:
        for dep in app.deployments:
            # kept as a plain dict by the schema: validate it on its own
            AutoscalingConfig.model_validate(dep.autoscaling_config)


@pytest.mark.parametrize(
    "path, typo",
    [
        ((), "proxy_locaton"),
        (("http_options",), "prot"),
        (("applications", 0), "imports_path"),
        (("applications", 0, "deployments", 1), "max_ongoing_request"),
        (("applications", 0, "deployments", 1, "autoscaling_config"), "target_ongoing_request"),
        (("applications", 0, "deployments", 1, "ray_actor_options"), "num_gpu"),
    ],
)
def test_unknown_keys_are_caught(path, typo):
    config = yaml.safe_load(yaml.safe_dump(CONFIGS["specserve/configs/serve.yaml"]))
    node = config
    for key in path:
        node = node[key]
    node[typo] = 1
    assert [p for p in unknown_keys(ServeDeploySchema, config) if typo in p]


def test_platform_contract():
    config = CONFIGS["specserve/configs/serve.yaml"]
    assert config["http_options"]["host"] == "0.0.0.0" and config["http_options"]["port"] == 8000
    (app,) = config["applications"]
    assert app["route_prefix"] == "/"
    assert app["import_path"] == "specserve.platform.rayserve.deployments:build_app"
    args = app["args"]
    catalog = k8s_render.load_yaml(ROOT / "specserve" / "configs" / "models.yaml")["models"]
    assert args["models"] and set(args["models"]) <= set(catalog)
    assert PlatformSettings.from_args(args, env={}).resolved_policy_file().is_file()
    assert args["adapter_root"] is None or Path(args["adapter_root"]).is_absolute()
    assert (
        args["max_body_bytes"] > 0
        and args["max_tokens"] > 0
        and 0 < args["adapter_memory_fraction"] < 1
    )
    names = [d["name"] for d in app["deployments"]]
    assert names == ["Gateway"] + [f"ModelServer-{m}" for m in args["models"]]
    for dep in app["deployments"]:
        scaling = dep["autoscaling_config"]
        assert 1 <= scaling["min_replicas"] < scaling["max_replicas"], dep["name"]
        assert scaling["target_ongoing_requests"] <= dep["max_ongoing_requests"], dep["name"]
        assert dep["max_queued_requests"] > 0, dep["name"]
        assert dep["ray_actor_options"]["num_cpus"] > 0, dep["name"]
        assert "num_gpus" not in dep["ray_actor_options"], "CPU-sized here; GPUs come from overlays"
