"""A real `specserve up` subprocess for end-to-end tests (`from e2e.upstack import ...`): a tiny
model's Serve config, a tmp cache, a free loopback port; `start_up` returns once /healthz answers
ok, `stop_up` sends SIGINT, waits a bounded time, then SIGKILLs whatever of its tree is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from specserve.platform.rayserve.up import admin_token_file
from specserve.platform.state.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]
# the parent's settings must not leak into the stack under test: it makes its own store and token
STRIPPED_ENV = (
    "RAY_ADDRESS",
    "REDIS_URL",
    "SPECSERVE_POOL_REDIS_URL",
    "SPECSERVE_ADAPTER_ROOT",
    "SPECSERVE_ADMIN_TOKEN",
    "SPECSERVE_CACHE",
    "SPECSERVE_POLICY_FILE",
    "SPECSERVE_TENANT_KEYS_FILE",
)


@dataclass(frozen=True)
class UpProcess:
    """One running `specserve up`: where it answers, its admin token and where it keeps things."""

    proc: subprocess.Popen
    host: str
    port: int
    admin_token: str
    cache_dir: Path
    log_file: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


def tiny_serve_config(path: Path, model_dir: Path, **args) -> Path:
    """The packaged serve.yaml cut down to one tiny float32 model, one replica of each deployment,
    small batches and a short drain; `args` override application args."""
    config = yaml.safe_load((REPO / "specserve" / "configs" / "serve.yaml").read_text())
    (app,) = config["applications"]
    app["args"] |= {
        "models": ["tiny"],
        "model_dirs": {"tiny": str(model_dir)},
        "dtype": "float32",
        "compile": "off",
        "torch_threads": 1,
        "max_tokens": 240,
        "batch": {"max_batch": 4, "max_queue": 8, "max_queue_per_tenant": 8, "kv_tokens": 4096},
        "shutdown_timeout_s": 5,
    } | args
    app["deployments"] = [
        {"name": "Gateway", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
        {
            "name": "ModelServer-tiny",
            "num_replicas": 1,
            "max_ongoing_requests": 8,
            "health_check_period_s": 2,
            "ray_actor_options": {"num_cpus": 0},
        },
    ]
    path.write_text(yaml.safe_dump(config))
    return path


def call(url: str, method="GET", body=None, token=None, timeout=60) -> tuple[int, str]:
    """(status, body text) of one HTTP request; HTTP errors are answers, not exceptions."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _said_up(log_file: Path, start: int, host: str, port: int) -> bool:
    """`up` logged that it is up since byte `start`: past serve.run, about to handle signals."""
    with open(log_file, "rb") as log:
        log.seek(start)
        return f"specserve is up on http://{host}:{port} ".encode() in log.read()


def _healthy(base_url: str) -> bool:
    try:
        status, text = call(f"{base_url}/healthz", timeout=5)
    except (OSError, urllib.error.URLError):
        return False
    return status == 200 and json.loads(text).get("status") == "ok"


def start_up(
    config: Path,
    cache_dir: Path,
    log_file: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    num_cpus: int = 2,
    env: dict[str, str] | None = None,
    timeout_s: float = 150,
) -> UpProcess:
    """Launch `specserve up` in its own session; return once it has logged that it is up and
    GET /healthz says ok (or raise with the log's tail, after killing it, if it exits first or is
    not ready within `timeout_s`)."""
    port = port or free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV} | (env or {})
    argv = [sys.executable, "-m", "specserve.cli", "up", "--config", str(config)]
    argv += ["--host", host, "--port", str(port), "--cache-dir", str(cache_dir)]
    argv += ["--num-cpus", str(num_cpus)]
    log_start = log_file.stat().st_size if log_file.exists() else 0
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
        )
    probe = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    deadline = time.monotonic() + timeout_s
    while not (_said_up(log_file, log_start, host, port) and _healthy(f"http://{probe}:{port}")):
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_tree(proc, _tree(proc.pid))
            tail = log_file.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"specserve up not ready (rc={proc.returncode}):\n{tail}")
        time.sleep(0.5)
    token = admin_token_file(cache_dir).read_text().strip()
    return UpProcess(proc, probe, port, token, Path(cache_dir), Path(log_file))


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_tree(proc: subprocess.Popen, tree: list[psutil.Process]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in tree:  # descendants Ray moved to other process groups
        with suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=10)


@dataclass(frozen=True)
class Stopped:
    """How a stop went: `up`'s exit status (None: it had to be killed) and its descendants still
    alive `linger_s` after it exited (killed then), as "pid name"."""

    rc: int | None
    leftovers: list[str]


def stop_up(up: UpProcess, timeout_s: float = 60, linger_s: float = 10) -> Stopped:
    """SIGINT, wait up to `timeout_s` for `up` to exit and `linger_s` more for its descendants;
    SIGKILL whatever of the tree is left."""
    tree = _tree(up.pid)
    if up.proc.poll() is None:
        up.proc.send_signal(signal.SIGINT)
    try:
        rc = up.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    _, alive = psutil.wait_procs(tree[1:], timeout=linger_s)
    leftovers = []
    for proc in alive:
        with suppress(psutil.NoSuchProcess):
            leftovers.append(f"{proc.pid} {proc.name()}")
    if rc is None or alive:
        _kill_tree(up.proc, alive)
    return Stopped(rc, leftovers)


@contextmanager
def running_up(config: Path, cache_dir: Path, log_file: Path, **kw):
    """start_up ... stop_up, whatever happens in between."""
    up = start_up(config, cache_dir, log_file, **kw)
    try:
        yield up
    finally:
        stop_up(up)
