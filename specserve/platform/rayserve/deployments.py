"""The Ray Serve application of specserve/configs/serve.yaml: `build_app(args)` wires a `Gateway`
ingress and one `ModelServer-<model>` per base model (built by platform/serving.py); requests for a
variant are multiplexed by variant@version to replicas that hold its adapter, Serve's per-replica
cache and the resident set counting to one number (`variant_cache`). The builder loads nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import ray
from ray import serve

from specserve.adapters.settings import AdapterLimits
from specserve.platform.api.faults import faults_router
from specserve.platform.api.metrics import Metrics
from specserve.platform.batch_compile import BatchCompile
from specserve.platform.events import Done
from specserve.platform.faults import inject
from specserve.platform.rayserve.backend import ServeBackend
from specserve.platform.rayserve.drain import GatewayDrainWatch
from specserve.platform.rayserve.jobs import RayJobs
from specserve.platform.rayserve.stores import platform_stores
from specserve.platform.replica_stats import PoolStats, ReplicaStats
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.pool_sync import PoolSync
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

log = logging.getLogger(__name__)


def build_app(args: dict, deployments: list[dict] | None = None) -> serve.Application:
    """Serve's application builder (import path in specserve/configs/serve.yaml). `deployments`: the config's
    per-deployment options, for callers that bypass `serve run` (`specserve up`)."""
    settings = PlatformSettings.from_args(
        args, env={}
    )  # validate args now; secrets load in replicas
    options = {d["name"]: {k: v for k, v in d.items() if k != "name"} for d in deployments or []}
    # a replica Serve stops (scale-down, redeploy, shutdown) gets as long as a drain to finish
    for name in ["Gateway", *(f"ModelServer-{m}" for m in settings.models)]:
        options.setdefault(name, {}).setdefault(
            "graceful_shutdown_timeout_s", settings.shutdown_timeout_s
        )
    servers = {}
    for model in settings.models:
        name = f"ModelServer-{model}"
        servers[model] = ModelServer.options(name=name, **options.get(name, {})).bind(
            model, dict(args)
        )
    return GatewayDeployment.options(name="Gateway", **options.get("Gateway", {})).bind(
        dict(args), servers
    )


@serve.deployment
class ModelServer:
    """One base model: loads it, serves its variants through ModelService, syncs n-gram pools."""

    def __init__(self, model_id: str, args: dict) -> None:
        import torch  # lazy: the app builder (`serve run`, `specserve up`) loads no torch (~2 s)

        from specserve.platform.serving import build_service  # lazy: torch, transformers (~5 s)

        settings = PlatformSettings.from_args(args)
        torch.set_num_threads(settings.resolved_torch_threads())
        self.service = build_service(settings, model_id)
        _, pool_store = platform_stores(settings)
        self.sync = PoolSync(pool_store, self.service.pools, base_model=model_id).start()
        # the batched forward compiles in the background (minutes on a CPU); eager until warm
        cache_dir = settings.resolved_cache_dir()
        self.compile = BatchCompile().start(self.service, settings.compile, model_id, cache_dir)
        self.model_id = model_id
        self.stall_s = settings.engine_stall_s
        self.fault_injection = settings.fault_injection
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._warm: set = set()
        self.variant = variant_cache(self.service)
        gc.freeze()  # the loaded model's objects leave the collector's scans (0.5 s pauses)

    async def generate(self, request: dict) -> AsyncIterator[dict]:
        """The events of ModelService.generate as dicts (`parse_event` reads them back)."""
        from specserve.platform.requests import GenerateRequest  # lazy: imports torch (~5 s)

        req = GenerateRequest.model_validate(request)
        if req.target.key is not None:
            await self.variant(serve.get_multiplexed_model_id() or str(req.target.key))
            if (
                req.target.key not in self._warm
            ):  # first request of this version here: pull its pool
                self._warm.add(req.target.key)
                await asyncio.to_thread(self.sync.warm_start, req.target.key, 0.5)
        async for event in self.service.generate(req):
            if isinstance(event, Done):  # which replica served it (routing is observable)
                event = event.served_by(self.replica)
            yield event.model_dump()

    def check_health(self) -> None:
        """Serve's periodic probe (health_check_period_s in specserve/configs/serve.yaml): raising
        makes Serve replace this replica, when its engine loop died or hangs with work queued."""
        health = self.service.health(self.stall_s)
        if not health.ok:
            log.error("replica %s of %s unhealthy: %s", self.replica, self.model_id, health.reason)
            raise RuntimeError(f"{self.model_id}: {health.reason}")

    def inject_fault(self, kind: str) -> str:
        """The fault suite's engine-loop faults (platform/faults.py), only when enabled."""
        if not self.fault_injection:
            raise RuntimeError("fault injection is off (SPECSERVE_FAULT_INJECTION)")
        log.warning("replica %s of %s: injecting %s", self.replica, self.model_id, kind)
        return f"{inject(self.service, kind)} on replica {self.replica}"

    def stats(self) -> ReplicaStats:
        """The service's figures, with this replica's Serve cache size, compiled forward and
        pool sync (a `ReplicaStats` crosses to the gateway as it is)."""
        stats = self.service.stats()
        cache = {"variant_cache_size": self.service.adapters.capacity}
        pools = PoolStats(sync_ok=self.sync.health().get("status") == "ok")
        update = {"adapters": stats.adapters.model_copy(update=cache), "pools": pools}
        return stats.model_copy(update=update | {"compile": self.compile.state})

    def __del__(self) -> None:
        sync = getattr(self, "sync", None)
        if sync is not None:
            sync.stop()
        service = getattr(self, "service", None)
        if service is not None:
            service.stop()


def variant_cache(service) -> Callable[[str], Awaitable[_Held]]:
    """Serve's multiplexing cache of a replica's variants (`await cache(key)` marks `key` held
    here; ModelService loads the adapter): as large as the resident set may grow, its
    `capacity`, which serving.resident_adapters makes the set's count cap too. Serve dropping a
    variant evicts its adapter (unless a request holds it)."""

    async def hold_here(key: str) -> _Held:
        return _Held(key, service)

    return serve.multiplexed(max_num_models_per_replica=service.adapters.capacity)(hold_here)


class _Held:
    """What Serve's multiplexing cache keeps per variant on a replica; its unload evicts the
    adapter from the replica's resident set too, so the two agree."""

    def __init__(self, key: str, service) -> None:
        self.key, self.service = key, service
        self.released = False

    def __del__(self) -> None:
        # Serve calls this when it drops the variant, and Python again when it frees the object
        # (by then the variant may be back in Serve's cache under a new `_Held`): once only
        if self.released:
            return
        self.released = True
        with contextlib.suppress(Exception):  # a replica shutting down: nothing left to evict
            self.service.release_variant(self.key)


@serve.deployment
@serve.ingress(None)
class GatewayDeployment:
    """The FastAPI ingress: builds the gateway and admin API in this replica (Serve takes the app
    from `__serve_build_asgi_app__`, called after __init__)."""

    def __init__(self, args: dict, servers: dict) -> None:
        # the app builder (`serve run`, `specserve up`) imports this module without torch
        from specserve.platform.api.admin import Admin, admin_router  # lazy: torch (~5 s)
        from specserve.platform.api.gateway import Gateway  # lazy: torch (~5 s)
        from specserve.platform.api.routes import create_app  # lazy: torch (~5 s)
        from specserve.platform.serving import base_spec  # lazy: torch, transformers (~5 s)

        settings = PlatformSettings.from_args(args)
        registry_store, _ = platform_stores(settings)
        registry = Registry(registry_store)
        gateway = Gateway(
            settings, registry, ServeBackend(servers, settings.retry_within_s), Metrics()
        )
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        limits = AdapterLimits(root=settings.resolved_adapter_root())
        specs = {m: base_spec(settings, m) for m in settings.models}
        policy = PolicySettings.from_yaml(settings.resolved_policy_file())
        admin = Admin(registry, token, specs, limits, policy, RayJobs(args))
        gateway.on_train = admin.auto_train  # the policy's requests for drafters start jobs
        gateway.on_retrain = admin.auto_retrain  # and its requests for retrains from traffic
        self.fastapi_app = create_app(
            gateway, admin_router(admin), faults_router(gateway, admin.check)
        )
        self.started = time.time()
        replica = serve.get_replica_context().replica_id.unique_id
        node = ray.get_runtime_context().get_node_id()
        self.drain_watch = GatewayDrainWatch(
            replica, node, gateway.inflight_total, gateway.drain.begin
        ).start()
        gc.freeze()  # start-up objects (torch, transformers) leave the collector's scans

    def __serve_build_asgi_app__(self):
        return self.fastapi_app

    def __del__(self) -> None:
        watch = getattr(self, "drain_watch", None)
        if watch is not None:
            watch.stop()
