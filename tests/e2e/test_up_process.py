"""`specserve up` as a real process tree (tiny model, embedded redis, local Ray): on a loopback
--host every socket any of its processes listens on is loopback, and a registered variant (its
version and its answers) survives stopping the whole app with SIGINT and starting it again, on the
embedded redis that /healthz and the log name as durable."""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import transformers
from e2e.upstack import UpProcess, call, start_up, stop_up, tiny_serve_config

pytestmark = pytest.mark.timeout(420)
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9"


@dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    proto: str
    pid: int
    process: str


@dataclass
class Stack:
    """The first `up` of the module and what the tests learn about it along the way."""

    up: UpProcess
    config: Path
    model_dir: Path
    start_s: float


@pytest.fixture(scope="module")
def stack(tmp_path_factory, save_tiny_model_dir):
    tmp = tmp_path_factory.mktemp("up-process")
    model_dir = save_tiny_model_dir(tmp / "model")
    config = tiny_serve_config(tmp / "serve.yaml", model_dir)
    began = time.monotonic()
    up = start_up(config, tmp / "cache", tmp / "up.log")
    stack = Stack(up, config, model_dir, time.monotonic() - began)
    try:
        yield stack
    finally:
        stop_up(stack.up)


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _listeners(pid: int) -> list[Listener]:
    """Every TCP socket in LISTEN and every UDP socket of `pid` and its descendants."""
    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = " ".join(proc.cmdline()) or proc.name()  # whole: paths differ in length
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # an idle worker that just exited
        for conn in conns:
            udp = conn.type == socket.SOCK_DGRAM
            if udp or conn.status == psutil.CONN_LISTEN:
                proto = "udp" if udp else "tcp"
                found.append(Listener(conn.laddr.ip, conn.laddr.port, proto, proc.pid, name))
    return found


def _chat(base_url: str, model: str) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    status, text = call(f"{base_url}/v1/chat/completions", "POST", body)
    assert status == 200, text
    return json.loads(text)["choices"][0]["message"]["content"]


def test_every_listener_of_the_up_process_tree_is_on_loopback(stack):
    up = stack.up
    _chat(up.base_url, "tiny")
    listeners = _listeners(up.pid)
    elsewhere = [item for item in listeners if not _is_loopback(item.ip)]
    assert not elsewhere, "listening beyond loopback:\n" + "\n".join(map(str, elsewhere))
    gateway = [item for item in listeners if item.port == up.port and item.proto == "tcp"]
    assert gateway and all(item.ip == "127.0.0.1" for item in gateway), gateway
    assert any("gcs_server" in item.process for item in listeners), listeners
    replicas = {item.process for item in listeners if "ServeReplica" in item.process}
    assert any("ModelServer-tiny" in name for name in replicas), listeners
    assert len(listeners) >= 10, listeners  # GCS, raylet, agents, workers, proxy, replicas
    print(f"{len(listeners)} listeners, all on loopback")


def _register(up: UpProcess, target: Path) -> dict:
    body = {"name": "bot", "base_model": "tiny", "adapter_path": str(target)}
    status, text = call(f"{up.base_url}/admin/variants", "POST", body, token=up.admin_token)
    assert status == 201, text
    return json.loads(text)


def _listed(up: UpProcess) -> tuple[dict, list[str]]:
    status, text = call(f"{up.base_url}/admin/variants", token=up.admin_token)
    assert status == 200, text
    variants = {v["name"]: v for v in json.loads(text)["variants"]}
    status, text = call(f"{up.base_url}/v1/models")
    assert status == 200, text
    return variants, [m["id"] for m in json.loads(text)["data"]]


def test_a_variant_survives_a_restart_of_the_whole_app(stack, make_adapter):
    up = stack.up
    tiny = transformers.AutoModelForCausalLM.from_pretrained(stack.model_dir).eval()
    root = up.cache_dir / "adapters"  # the default adapter root of `up`
    for seed in (1, 2):  # two versions: the version counter must survive too
        made = make_adapter(f"bot-v{seed}", tiny, seed=seed, base_name="tiny")
        record = _register(up, shutil.copytree(made, root / made.name))
    assert record["version"] == 2
    answer = _chat(up.base_url, "bot")
    assert answer != _chat(up.base_url, "tiny")  # the adapter is in play

    began = time.monotonic()
    stopped = stop_up(up)
    stop_s = time.monotonic() - began
    assert stopped.rc == 0 and stopped.leftovers == [], stopped  # the whole app went away
    began = time.monotonic()
    again = start_up(stack.config, up.cache_dir, up.log_file, port=up.port)
    stack.up = again  # the fixture stops this one
    restart_s = time.monotonic() - began
    variants, models = _listed(again)
    health = json.loads(call(f"{again.base_url}/healthz")[1])
    assert health["store_kind"] == "redis-embedded" and health["durable"] is True, health
    said = [line for line in again.log_text().splitlines() if "store: redis-embedded: " in line]
    assert said and "durable: yes" in said[-1], said  # the startup log names it too
    bot = variants["bot"]
    assert bot["current_version"] == 2 and len(bot["versions"]) == 2, bot
    assert bot["versions"][-1]["adapter_sha256"] == record["adapter_sha256"], bot
    assert models == ["tiny", "bot"]
    assert again.admin_token == up.admin_token  # kept in <cache>/admin-token
    assert _chat(again.base_url, "bot") == answer
    print(f"first start {stack.start_s:.1f} s, stop {stop_s:.1f} s, restart {restart_s:.1f} s")
