"""`specserve up`: the whole platform on this machine — the store (REDIS_URL, else a private,
supervised redis-server with its AOF under the cache; no binary: an error saying how to get one;
the in-cluster memory store only when asked for, `--store memory`), a local Ray, and the Serve
application of specserve/configs/serve.yaml on one port."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
from pathlib import Path

import yaml

from specserve.env import DEPLOYMENT_VARIABLES, EnvVar
from specserve.paths import config_file
from specserve.platform.rayserve import loopback
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.embedded import NoRedisServer, StoreSettings, resolve_store


def admin_token_file(cache_dir: Path) -> Path:
    return Path(cache_dir) / "admin-token"


def embedded_redis_dir(cache_dir: Path) -> Path:
    """Where the private redis-server keeps its AOF: the registry survives a restart of `up`."""
    return Path(cache_dir) / "redis"


def ensure_admin_token(cache_dir: Path, env: dict) -> str:
    """SPECSERVE_ADMIN_TOKEN, else the one in <cache>/admin-token, else a new random one saved there."""
    if env.get(EnvVar.ADMIN_TOKEN):
        return env[EnvVar.ADMIN_TOKEN]
    path = admin_token_file(cache_dir)
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    path.write_text(token)
    path.chmod(0o600)
    return token


def load_serve_config(path: Path) -> tuple[dict, list[dict], dict]:
    """(args, deployment options, http_options) of the single application in a Serve config."""
    config = yaml.safe_load(Path(path).read_text())
    (app,) = config["applications"]
    return (
        dict(app.get("args") or {}),
        list(app.get("deployments") or []),
        dict(config.get("http_options") or {}),
    )


def open_store(settings, cache_dir: Path, log=print):
    """The store `up` runs on, said in one log line with its kind and whether it is durable:
    (Stores to close at the end or None, env for every process of the app). Raises
    `NoRedisServer` (its message says how to get one) when Redis is asked for and none exists."""
    if settings.store == "memory":
        log(
            "store: memory (in-cluster, durable: no: variants and pools are lost when `up` "
            "stops; chosen with --store memory / store: memory)"
        )
        return None, {EnvVar.REDIS_EMBEDDED: "0"}
    stores = resolve_store(
        StoreSettings(
            redis_url=settings.redis_url,
            pool_redis_url=settings.pool_redis_url,
            embedded_data_dir=embedded_redis_dir(cache_dir),
        )
    )
    durable = {True: "yes", False: "no", None: "unknown"}[stores.durable()]
    if stores.embedded is not None:
        server = stores.embedded
        log(
            f"store: {stores.describe()} (durable: {durable}, AOF in {server.data_dir}; "
            f"server {server.binary})"
        )
        return stores, {EnvVar.REDIS_URL: stores.redis_url, EnvVar.REDIS_EMBEDDED: "1"}
    log(f"store: {stores.describe()} (durable: {durable})")
    return stores, {EnvVar.REDIS_EMBEDDED: "0"}


def up(
    config: Path,
    host: str,
    port: int,
    cache_dir: Path,
    num_cpus: int | None,
    log=print,
    ready=None,
    stop: threading.Event | None = None,
    store: str | None = None,
) -> int:
    """Start everything, block until SIGINT/SIGTERM (or `stop`), drain (new requests 503,
    in-flight ones get `shutdown_timeout_s`), then tear down in reverse. `store`: "redis" or
    "memory" over the config's `store` arg. Without a Redis (and no memory store asked for): the
    error, said in the log, and 2 before anything else starts."""
    # lazy, these three: tools import this module's helpers (paths, config) without Ray
    import ray  # lazy: Ray (~1 s)
    from ray import serve  # lazy: Ray Serve (~3 s)

    from specserve.platform.rayserve.deployments import build_app  # lazy: Ray Serve (~3 s)

    args, deployments, _ = load_serve_config(config)
    if store is not None:
        args["store"] = store
    settings = PlatformSettings.from_args(args)
    try:
        stores, store_env = open_store(settings, cache_dir, log)
    except NoRedisServer as err:
        log(f"error: {err}")
        return 2
    _pull_models(settings, cache_dir, log)
    env = _app_env(cache_dir, host, store_env)
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        runtime_env={"env_vars": env, **loopback.runtime_env_for(host)},
        log_to_driver=False,
    )
    done, give_up = stop or threading.Event(), threading.Event()
    if stop is None:  # from here on (Ray up): a signal during start-up stops once it is up
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: _stop_requested(done, give_up, log))
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(args, deployments), name="specserve", route_prefix="/", blocking=False)
        log(f"specserve is up on http://{host}:{port} (models: {', '.join(settings.models)})")
        log(f"admin token: {admin_token_file(cache_dir)} (or SPECSERVE_ADMIN_TOKEN)")
        if ready is not None:
            ready()
        done.wait()
        _drain(settings.shutdown_timeout_s, log, give_up)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            if stores is not None:
                stores.close()
    return 0


def _pull_models(settings: PlatformSettings, cache_dir: Path, log) -> None:
    """Download (or convert) into the cache each served model not given as a directory."""
    from specserve.models.provision import pull_model  # lazy: torch, transformers (~4 s)

    for model in settings.models:
        if model not in settings.model_dirs:
            pull_model(model, cache_dir, progress=log)


def _app_env(cache_dir: Path, host: str, store_env: dict[str, str]) -> dict[str, str]:
    """The env of every process of the app (also set in this one): the cache, the store, the
    admin token, loopback confinement and the `DEPLOYMENT_VARIABLES` this shell has."""
    env = {EnvVar.CACHE: str(cache_dir)} | store_env
    env[EnvVar.ADMIN_TOKEN] = ensure_admin_token(cache_dir, dict(os.environ))
    env |= loopback.confine_to(host)  # a loopback --host: every Ray listener on 127.0.0.1
    os.environ.update(env)
    for name in DEPLOYMENT_VARIABLES:
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def _stop_requested(done: threading.Event, give_up: threading.Event, log) -> None:
    """The first SIGINT/SIGTERM drains; a second one stops without waiting."""
    if done.is_set():
        log("second signal: stopping now")
        give_up.set()
    done.set()


def _drain(timeout_s: float, log, give_up: threading.Event) -> None:
    """Stop admission, let in-flight requests finish (rayserve/drain.py); never blocks the stop."""
    from specserve.platform.rayserve.drain import drain_platform  # lazy: Ray (~1.5 s)

    log(f"stopping: draining (up to {timeout_s:g} s; signal again to stop now)")
    try:
        drain_platform(timeout_s, log, give_up=give_up)
    except Exception as err:  # noqa: BLE001 - a failed drain must not keep the platform up
        log(f"drain failed ({err}); stopping anyway")


def default_config() -> Path:
    return config_file("serve.yaml")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(up(default_config(), "127.0.0.1", 8000, Path.home() / ".cache" / "specserve", None))
