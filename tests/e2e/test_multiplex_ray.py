"""Routing by variant on a local Ray: two ModelServer replicas of the tiny model; Serve's
multiplexing keeps a variant's requests on the replica that holds it, and its per-replica cache is
the replica's resident-adapter capacity (so the two agree). HTTP on loopback, bounded requests."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
import transformers
import yaml

from specserve.platform.state.redis_server import EmbeddedRedis, free_port

pytestmark = pytest.mark.timeout(600)
TOKEN = "mux-admin"
REPO = Path(__file__).resolve().parents[2]
CAP = 2  # max_adapters_per_replica: each replica holds two variants


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory, save_tiny_model_dir):
    import ray
    from ray import serve

    from specserve.platform.rayserve.deployments import build_app

    tmp = tmp_path_factory.mktemp("mux")
    model_dir = save_tiny_model_dir(tmp / "model")
    adapter_root = tmp / "adapters"
    adapter_root.mkdir()
    redis = EmbeddedRedis(start_timeout_s=10).start()
    env = {"REDIS_URL": redis.url, "SPECSERVE_ADMIN_TOKEN": TOKEN, "SPECSERVE_CACHE": str(tmp)}
    config = yaml.safe_load((REPO / "specserve" / "configs" / "serve.yaml").read_text())[
        "applications"
    ][0]
    args = config["args"] | {
        "models": ["tiny"],
        "model_dirs": {"tiny": str(model_dir)},
        "adapter_root": str(adapter_root),
        "dtype": "float32",
        "max_adapters_per_replica": CAP,
        "torch_threads": 1,
    }
    deployments = [
        {"name": "Gateway", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        {"name": "ModelServer-tiny", "num_replicas": 2, "ray_actor_options": {"num_cpus": 0}},
    ]
    port = free_port()
    os.environ.update(env)
    ray.init(
        num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args, deployments), name="specserve", route_prefix="/")
        yield f"http://127.0.0.1:{port}", adapter_root, model_dir
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
        for key in env:
            os.environ.pop(key, None)


def _post(url, body, token=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _served_by(base, model) -> str:
    body = {"model": model, "prompt": "w5 w9 w14", "max_tokens": 3, "temperature": 0}
    return _post(f"{base}/v1/completions", body)["specserve"]["replica"]


def test_a_variants_requests_stay_on_the_replica_holding_it(two_replicas, make_adapter):
    base, adapter_root, model_dir = two_replicas
    tiny = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    for i, name in enumerate(["ma", "mb"]):
        made = make_adapter(name, tiny, seed=i, base_name="tiny")
        shutil.copytree(made, adapter_root / name)
        spec = {"name": name, "base_model": "tiny", "adapter_path": str(adapter_root / name)}
        _post(f"{base}/admin/variants", spec, token=TOKEN)
    holder = {}
    for name in ["ma", "mb"]:
        holder[name] = _served_by(base, name)  # a cold load on whichever replica Serve picks
    time.sleep(2.0)  # replicas push the variants they hold to Serve's controller
    for _ in range(4):
        for name in ["ma", "mb"]:
            assert _served_by(base, name) == holder[name]
    stats = [s for s in _replica_stats(base) if s]  # the replica /metrics sampled
    assert stats and all(s["variant_cache_size"] == CAP for s in stats)
    assert all(s["adapters_resident"] <= CAP for s in stats)


def _replica_stats(base) -> list[dict]:
    """The model servers' figures, as the gateway's /metrics exports them."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    rows: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("specserve_replica_adapters{"):
            labels, value = line.split("} ")
            fields = dict(kv.split("=") for kv in labels.split("{", 1)[1].split(","))
            figure = fields["figure"].strip('"')
            key = {"resident": "adapters_resident"}.get(figure, figure)
            rows.setdefault(fields["replica"], {})[key] = float(value)
    return list(rows.values())
