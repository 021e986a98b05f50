"""The registry at N registered variants (default 1,000): per-registration time (p50 of the first
and last 50), `/v1/models` through the FastAPI app (cached, and the first call after a change),
gateway resolution (cold: first request for a name since the last change; warm: cached), the
admin list (one page) and `specserve variants list` (every page, over real HTTP). Prints a table.

Usage: python scripts/registry_scale.py [--store redis|memory] [--variants 1000] [--calls 200]
    [--gc-freeze]
`--store redis` starts a private redis-server on loopback (the tests' `EmbeddedRedis`).
`--gc-freeze`: `gc.freeze()` once the variants are registered, as a server could after startup (a
full collection over the torch-sized heap this process imports takes ~0.5 s here).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

BASE = "base-m"
TOKEN = "scale-token"


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": 1000 * statistics.median(ordered), "p99": 1000 * p99, "n": len(ordered)}


def _timed(fn: Callable[[], object], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


@contextlib.contextmanager
def _store(kind: str):
    from specserve.platform.state.memory_store import MemoryStore
    from specserve.platform.state.redis_server import EmbeddedRedis
    from specserve.platform.state.redis_store import RedisStore

    if kind == "memory":
        yield MemoryStore(), "in-process MemoryStore"
        return
    server = EmbeddedRedis(start_timeout_s=10).start()
    store = RedisStore(server.url)
    try:
        version = store._client.info("server")["redis_version"]
        yield store, f"redis-server {version}, loopback"
    finally:
        store.close()
        server.stop()


@contextlib.contextmanager
def _http(app):
    """The app on a loopback port (uvicorn in a thread) for the CLI's real HTTP client."""
    import uvicorn

    from specserve.platform.state.redis_server import free_port

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def run(kind: str, variants: int, calls: int, seed: int, freeze: bool) -> list[tuple[str, dict]]:
    from fastapi.testclient import TestClient

    from specserve.adapters.settings import AdapterLimits
    from specserve.cli import main as cli_main
    from specserve.platform.api.admin import Admin, admin_router
    from specserve.platform.api.gateway import Gateway
    from specserve.platform.api.metrics import Metrics
    from specserve.platform.api.routes import create_app
    from specserve.platform.backend import LocalBackend
    from specserve.platform.settings import PlatformSettings
    from specserve.platform.state.registry import Registry, VariantSpec
    from specserve.policies.settings import PolicySettings

    rng = random.Random(seed)
    rows: list[tuple[str, dict]] = []
    with _store(kind) as (store, where), tempfile.TemporaryDirectory() as tmp:
        registry = Registry(store)
        names = [f"v{i:04d}" for i in range(variants)]
        took = []
        for name in names:  # the call Admin.register makes once the adapter is validated
            spec = VariantSpec(
                name=name,
                base_model=BASE,
                adapter_path=f"/adapters/{name}",
                adapter_sha256=f"{rng.getrandbits(256):064x}",
                hints={"tier": "scale"},
            )
            start = time.perf_counter()
            registry.register(spec)
            took.append(time.perf_counter() - start)
        head, tail = _ms(took[:50]), _ms(took[-50:])
        rows.append(("register, first 50", head))
        rows.append(("register, last 50", tail | {"ratio": tail["p50"] / head["p50"]}))
        if freeze:
            gc.freeze()

        gateway = Gateway(PlatformSettings(models=[BASE]), registry, LocalBackend({}), Metrics())
        admin = Admin(registry, TOKEN, {}, AdapterLimits(root=Path(tmp)), PolicySettings())
        app = create_app(gateway, admin_router(admin))
        client = TestClient(app)
        listed = client.get("/v1/models").json()["data"]
        assert len(listed) == variants + 1, f"/v1/models listed {len(listed)}"
        rows.append(
            ("/v1/models (TestClient)", _ms(_timed(lambda: client.get("/v1/models"), calls)))
        )

        bump = spec.model_copy(update={"name": "bump"})  # its versions: changes, caches go stale
        missed = []
        for _ in range(20):
            registry.register(bump)
            start = time.perf_counter()
            client.get("/v1/models")
            missed.append(time.perf_counter() - start)
        rows.append(("/v1/models, first after a change", _ms(missed)))

        picks = [rng.choice(names) for _ in range(calls)]
        registry.register(bump)
        cold = []
        for name in dict.fromkeys(picks):
            start = time.perf_counter()
            gateway.resolve(name, None)
            cold.append(time.perf_counter() - start)
        rows.append(("resolve, cold", _ms(cold)))
        warm = iter(picks)
        rows.append(
            ("resolve, warm", _ms(_timed(lambda: gateway.resolve(next(warm), None), calls)))
        )

        admin_headers = {"Authorization": f"Bearer {TOKEN}"}
        page = client.get("/admin/variants", headers=admin_headers).json()
        rows.append(
            (
                "GET /admin/variants",
                _ms(_timed(lambda: client.get("/admin/variants", headers=admin_headers), 10))
                | {"items": len(page["variants"])},
            )
        )
        with _http(app) as url:
            argv = ["variants", "list", "--url", url, "--token", TOKEN, "--cache-dir", tmp]

            printed: list[str] = []

            def cli_list() -> None:
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    assert cli_main(argv) == 0
                printed.append(out.getvalue())

            samples = _timed(cli_list, 3)
            items = len(json.loads(printed[-1])["variants"])
            rows.append(("variants list (CLI, HTTP)", _ms(samples) | {"items": items}))
    print(f"store: {where}; {variants} variants" + ("; gc frozen" if freeze else ""))
    return rows


def _table(rows: list[tuple[str, dict]]) -> str:
    lines = ["| what | n | p50 ms | p99 ms | note |", "| --- | --- | --- | --- | --- |"]
    for what, r in rows:
        note = []
        if "ratio" in r:
            note.append(f"last/first p50 = {r['ratio']:.2f}")
        if "items" in r:
            note.append(f"{r['items']} variants returned")
        lines.append(f"| {what} | {r['n']} | {r['p50']:.3f} | {r['p99']:.3f} | {'; '.join(note)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["redis", "memory"], default="redis")
    parser.add_argument("--variants", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gc-freeze", action="store_true")
    args = parser.parse_args()
    if args.variants < 100:
        parser.error("--variants: at least 100 (first and last 50 are compared)")
    print(_table(run(args.store, args.variants, args.calls, args.seed, args.gc_freeze)))


if __name__ == "__main__":
    main()
