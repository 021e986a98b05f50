"""The platform for real: a local Ray running the Serve app of specserve/configs/serve.yaml (tiny model),
a real redis-server as registry and pool store; HTTP on loopback only, bounded requests."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import transformers
import yaml
from e2e.upstack import call

from specserve.engine.decode.engine import Engine
from specserve.engine.prompts import encode_messages
from specserve.engine.sampling import SamplingParams
from specserve.platform.state.redis_server import EmbeddedRedis, free_port

pytestmark = pytest.mark.timeout(600)
TOKEN = "e2e-admin"
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, save_tiny_model_dir):
    """(base url, redis server, adapter root, model dir) of a running app; torn down after."""
    import ray
    from ray import serve

    from specserve.platform.rayserve.deployments import build_app

    tmp = tmp_path_factory.mktemp("platform")
    model_dir = save_tiny_model_dir(tmp / "model")
    adapter_root = tmp / "adapters"
    adapter_root.mkdir()
    redis = EmbeddedRedis(start_timeout_s=10).start()
    env = {
        "REDIS_URL": redis.url,
        "SPECSERVE_ADMIN_TOKEN": TOKEN,
        "SPECSERVE_CACHE": str(tmp / "cache"),
    }
    config = yaml.safe_load((REPO / "specserve" / "configs" / "serve.yaml").read_text())[
        "applications"
    ][0]
    args = config["args"] | {
        "models": ["tiny"],
        "model_dirs": {"tiny": str(model_dir)},
        "adapter_root": str(adapter_root),
        "max_tokens": 240,
        "dtype": "float32",  # the exact mode: outputs compared token for token
    }
    deployments = [
        {"name": "Gateway", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        {
            "name": "ModelServer-tiny",
            "num_replicas": 1,
            "max_ongoing_requests": 8,
            "ray_actor_options": {"num_cpus": 0},
        },
    ]
    port = free_port()
    os.environ.update(env)
    ray.init(
        num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(args, deployments), name="specserve", route_prefix="/")
        yield f"http://127.0.0.1:{port}", redis, adapter_root, model_dir
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
        for key in env:
            os.environ.pop(key, None)


def _chat(base, model, stream=False):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
    }
    status, text = call(f"{base}/v1/chat/completions", "POST", body)
    assert status == 200, text
    if not stream:
        return json.loads(text)
    chunks = [
        json.loads(ln[6:])
        for ln in text.split("\n\n")
        if ln.startswith("data: ") and ln != "data: [DONE]"
    ]
    assert text.rstrip().endswith("data: [DONE]")
    return chunks


def _expected(model_dir, adapter_dir=None) -> str:
    import peft

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = encode_messages(tok, [{"role": "user", "content": PROMPT}])
    eos = frozenset([tok.eos_token_id])
    return Engine(model, tok, eos).generate(ids, SamplingParams(max_new_tokens=12)).text


@pytest.fixture(scope="module")
def tiny_base(stack):
    return transformers.AutoModelForCausalLM.from_pretrained(stack[3]).eval()


def _adapter(stack, make_adapter, tiny_base, name, seed) -> Path:
    """A random LoRA adapter for the tiny base, placed under the server's adapter root."""
    made = make_adapter(name, tiny_base, seed=seed, base_name="tiny")
    target = stack[2] / name
    shutil.copytree(made, target)
    return target


def test_register_chat_stream_and_new_version_without_restart(stack, make_adapter, tiny_base):
    base, _, _, model_dir = stack
    assert json.loads(call(f"{base}/healthz")[1])["status"] == "ok"
    assert _chat(base, "tiny")["choices"][0]["message"]["content"] == _expected(model_dir)

    v1 = _adapter(stack, make_adapter, tiny_base, "bot-v1", seed=1)
    status, text = call(
        f"{base}/admin/variants",
        "POST",
        {"name": "bot", "base_model": "tiny", "adapter_path": str(v1)},
    )
    assert status == 401
    status, text = call(
        f"{base}/admin/variants",
        "POST",
        {"name": "bot", "base_model": "tiny", "adapter_path": str(v1)},
        token=TOKEN,
    )
    assert status == 201, text
    models = [m["id"] for m in json.loads(call(f"{base}/v1/models")[1])["data"]]
    assert models == ["tiny", "bot"]

    want = _expected(model_dir, v1)
    body = _chat(base, "bot")
    assert body["choices"][0]["message"]["content"] == want != _expected(model_dir)
    assert body["specserve"]["version"] == 1 and body["specserve"]["reason"]
    chunks = _chat(base, "bot", stream=True)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == want

    v2 = _adapter(stack, make_adapter, tiny_base, "bot-v2", seed=2)
    status, text = call(
        f"{base}/admin/variants",
        "POST",
        {"name": "bot", "base_model": "tiny", "adapter_path": str(v2)},
        token=TOKEN,
    )
    assert status == 201 and json.loads(text)["version"] == 2
    again = _chat(base, "bot")
    assert again["specserve"]["version"] == 2
    assert again["choices"][0]["message"]["content"] == _expected(model_dir, v2)


def test_redis_outage_during_traffic(stack, make_adapter, tiny_base):
    base, redis, _, model_dir = stack
    want = _expected(model_dir)
    results: list[int] = []

    def traffic(n):
        for _ in range(n):
            results.append(
                call(
                    f"{base}/v1/completions",
                    "POST",
                    {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
                )[0]
            )

    thread = threading.Thread(target=traffic, args=(6,))
    thread.start()
    redis.stop()
    time.sleep(2.5)
    health = json.loads(call(f"{base}/healthz")[1])
    assert health["status"] == "degraded"
    thread.join(timeout=120)
    traffic(2)
    redis.start()
    deadline = time.time() + 20
    while json.loads(call(f"{base}/healthz")[1])["status"] != "ok" and time.time() < deadline:
        time.sleep(0.5)
    assert json.loads(call(f"{base}/healthz")[1])["status"] == "ok"
    assert results == [200] * 8
    assert _chat(base, "tiny")["choices"][0]["message"]["content"] == want


def test_errors_and_metrics(stack):
    base = stack[0]
    status, text = call(
        f"{base}/v1/chat/completions",
        "POST",
        {"model": "nope", "messages": [{"role": "user", "content": "w1"}]},
    )
    assert status == 404 and json.loads(text)["error"]["param"] == "model"
    status, _ = call(
        f"{base}/v1/completions", "POST", {"model": "tiny", "prompt": "w1", "max_tokens": 241}
    )
    assert status == 400
    status, text = call(f"{base}/metrics")
    assert (
        status == 200 and "specserve_requests_total" in text and "specserve_adapter_loads" in text
    )


def test_loadtest_over_variants_reports_every_mode_and_level(
    stack, make_adapter, tiny_base, tmp_path
):
    from specserve.cli import main

    base = stack[0]
    adapter = _adapter(stack, make_adapter, tiny_base, "load-adapter", seed=5)
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "\n".join(json.dumps({"turns": [f"w{i} w{i + 1} w{i} w{i + 1} w{i}"]}) for i in range(4))
    )
    out = tmp_path / "load.json"
    argv = [
        "loadtest",
        "--url",
        base,
        "--token",
        TOKEN,
        "--model",
        "tiny",
        "--variants",
        "2",
        "--adapter",
        str(adapter),
        "--concurrency",
        "1,4",
        "--requests",
        "4",
        "--modes",
        "ar,spec,policy",
        "--max-tokens",
        "8",
        "--data",
        str(data),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["variants"] == 2 and set(report["results"]) == {"ar", "spec", "policy"}
    for levels in report["results"].values():
        assert set(levels) == {"1", "4"}
        for level in levels.values():
            assert level["failed"] == 0 and level["throughput_tok_s"] > 0
            assert set(level) == {
                "throughput_tok_s",
                "ttft_p50_s",
                "ttft_p99_s",
                "itl_p50_s",
                "itl_p99_s",
                "tau",
                "failed",
            }
    assert report["results"]["ar"]["1"]["tau"] == 1.0
    engine = report["engine"]["ar"]["4"]  # the replica's loop figures around the level
    assert engine["decode_steps"] > 0 and engine["rows_per_step"] >= 1
    assert 0 < engine["busy_fraction"] <= 1.05 and engine["prefill_ms_per_token"] > 0
    shown = json.loads(call(f"{base}/admin/variants/load-0", token=TOKEN)[1])
    assert shown["override"] is None  # overrides are reset after the run


def test_client_disconnect_stops_the_generation(stack):
    import http.client
    import re

    base = stack[0]
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 240,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    finished = re.compile(r'specserve_requests_total\{[^}]*endpoint="completions"[^}]*\} (\S+)')

    def completed() -> float:
        return sum(float(v) for v in finished.findall(call(f"{base}/metrics")[1]))

    before = completed()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the first chunk is on its way: the request is decoding
    ongoing = re.compile(r"specserve_replica_ongoing\{[^}]*\} (\S+)")
    assert float(ongoing.search(call(f"{base}/metrics")[1]).group(1)) == 1.0
    conn.close()  # the client goes away mid-stream
    deadline = time.time() + 20
    while time.time() < deadline:
        if float(ongoing.search(call(f"{base}/metrics")[1]).group(1)) == 0.0:
            break
        time.sleep(0.2)
    assert float(ongoing.search(call(f"{base}/metrics")[1]).group(1)) == 0.0
    assert completed() == before  # it was stopped, not run to its 240 tokens
    cancelled = re.compile(r"specserve_replica_cancelled\{[^}]*\} (\S+)")
    assert float(cancelled.search(call(f"{base}/metrics")[1]).group(1)) == 1.0


def test_seeded_choices_and_logprobs_cross_ray(stack):
    """n choices, seeds and logprobs through Serve: events tagged by choice index and logprobs
    survive the trip from a replica; choice i equals a single request with seed + i."""
    base = stack[0]

    def chat(**kw):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 12,
            "temperature": 0.9,
        } | kw
        status, text = call(f"{base}/v1/chat/completions", "POST", body)
        assert status == 200, text
        return json.loads(text)

    both = chat(n=2, seed=5, logprobs=True, top_logprobs=2)
    assert [c["index"] for c in both["choices"]] == [0, 1]
    listed = 0
    for i, choice in enumerate(both["choices"]):
        alone = chat(seed=5 + i)
        assert choice["message"]["content"] == alone["choices"][0]["message"]["content"]
        listed += len(choice["logprobs"]["content"])
        assert all(len(t["top_logprobs"]) <= 2 for t in choice["logprobs"]["content"])
    assert listed == both["usage"]["completion_tokens"]  # one entry per completion token
