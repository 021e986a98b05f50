"""The Ray Serve application of specserve/configs/serve.yaml: `build_app(args)` wires a `Gateway` ingress and
one `ModelServer-<model>` per base model; requests for a variant are multiplexed by variant@version
so they go to replicas that already hold its adapter, Serve's per-replica cache sized by the
replica's resident-adapter budget. The builder loads nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator

from ray import serve

from specserve.platform.settings import PlatformSettings

log = logging.getLogger(__name__)
STORE_ACTOR = "specserve-store"


def build_app(args: dict, deployments: list[dict] | None = None) -> serve.Application:
    """Serve's application builder (import path in specserve/configs/serve.yaml). `deployments`: the config's
    per-deployment options, for callers that bypass `serve run` (`specserve up`)."""
    settings = PlatformSettings.from_args(
        args, env={}
    )  # validate args now; secrets load in replicas
    options = {d["name"]: {k: v for k, v in d.items() if k != "name"} for d in deployments or []}
    servers = {}
    for model in settings.models:
        name = f"ModelServer-{model}"
        servers[model] = ModelServer.options(name=name, **options.get(name, {})).bind(
            model, dict(args)
        )
    return GatewayDeployment.options(name="Gateway", **options.get("Gateway", {})).bind(
        dict(args), servers
    )


def platform_stores(settings: PlatformSettings):
    """(registry store, pool store): the Redis of REDIS_URL / SPECSERVE_POOL_REDIS_URL, else one
    in-cluster MemoryStore in a named Ray actor shared by every replica."""
    from specserve.platform.state.embedded import StoreSettings, ray_memory_store, resolve_store

    if settings.redis_url:
        stores = resolve_store(
            StoreSettings(redis_url=settings.redis_url, pool_redis_url=settings.pool_redis_url)
        )
        return stores.registry, stores.pools
    store = ray_memory_store(STORE_ACTOR)
    return store, store


@serve.deployment
class ModelServer:
    """One base model: loads it, serves its variants through ModelService, syncs n-gram pools."""

    def __init__(self, model_id: str, args: dict) -> None:
        import torch

        from specserve.adapters.resident import ResidentAdapters, base_model_names
        from specserve.adapters.settings import AdapterLimits
        from specserve.adapters.variants import PoolBook
        from specserve.engine.tuning import cached_choices
        from specserve.models.load import default_cache_dir, load_model
        from specserve.platform.batch_compile import BatchCompile
        from specserve.platform.service import ModelService
        from specserve.platform.state.pool_sync import PoolSync
        from specserve.policies.settings import PolicySettings

        settings = PlatformSettings.from_args(args)
        torch.set_num_threads(settings.resolved_torch_threads())
        source = settings.model_dirs.get(model_id, model_id)
        loaded = load_model(
            str(source),
            device=settings.device,
            dtype=settings.dtype,
            cache_dir=settings.cache_dir,
            workload=settings.dtype_workload(),
        )
        loaded.model_id = model_id  # the served name, whatever directory it came from
        self.dtype = {"dtype": str(loaded.dtype)} | (
            {"dtype_reason": loaded.dtype_choice.reason} if loaded.dtype_choice else {}
        )
        log.info("model %s in %s", model_id, self.dtype)
        limits = AdapterLimits(
            root=settings.resolved_adapter_root(),
            max_resident=settings.max_adapters_per_replica,
            resident_memory_fraction=settings.adapter_memory_fraction,
        )
        adapters = ResidentAdapters(loaded.model, base_model_names(model_id), limits)
        self.capacity = adapters.capacity  # Serve's cache and ours count the same adapters
        log.info(
            "%s: adapter budget %d MiB, %d adapters of rank 8",
            model_id,
            adapters.budget_bytes >> 20,
            self.capacity,
        )
        cache_dir = settings.cache_dir or default_cache_dir()
        curve, configs = cached_choices(
            cache_dir, model_id, loaded.device, loaded.dtype, ["lookahead", "prompt_lookup"]
        )
        pools = PoolBook(journal_size=4096)
        _, pool_store = platform_stores(settings)
        self.sync = PoolSync(pool_store, pools, base_model=model_id).start()
        policy = PolicySettings.from_yaml(settings.resolved_policy_file())
        self.service = ModelService(
            loaded,
            adapters,
            pools,
            policy,
            configs,
            curve.padded_width if curve else None,
            curve=curve,
            batch=settings.batch,
        ).start()
        # the batched forward compiles in the background (minutes on a CPU); eager until warm
        self.compile = BatchCompile().start(self.service, settings.compile, model_id, cache_dir)
        self.model_id = model_id
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._warm: set = set()
        service = self.service

        async def hold_here(key: str) -> _Held:
            """Serve's routing hook: marks `key` as held here (ModelService loads the adapter);
            when Serve's cache drops it, so does the resident set (if no request holds it)."""
            return _Held(key, service)

        self.variant = serve.multiplexed(max_num_models_per_replica=self.capacity)(hold_here)
        gc.freeze()  # the loaded model's objects leave the collector's scans (0.5 s pauses)

    async def generate(self, request: dict) -> AsyncIterator[dict]:
        from specserve.platform.service import GenerateRequest

        req = GenerateRequest.model_validate(request)
        if req.target.key is not None:
            await self.variant(serve.get_multiplexed_model_id() or str(req.target.key))
            if (
                req.target.key not in self._warm
            ):  # first request of this version here: pull its pool
                self._warm.add(req.target.key)
                await asyncio.to_thread(self.sync.warm_start, req.target.key, 0.5)
        async for event in self.service.generate(req):
            if event.get("type") == "done":  # which replica served it (routing is observable)
                event["specserve"]["replica"] = self.replica
            yield event

    def stats(self) -> dict:
        health = self.sync.health()
        stats = self.service.stats() | {"pool_sync_ok": health.get("status") == "ok"}
        compile_state = {f"compile_{k}": v for k, v in self.compile.state.model_dump().items()}
        return stats | self.dtype | compile_state | {"variant_cache_size": self.capacity}

    def __del__(self) -> None:
        sync = getattr(self, "sync", None)
        if sync is not None:
            sync.stop()
        service = getattr(self, "service", None)
        if service is not None:
            service.stop()


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


class ServeBackend:
    """Backend over deployment handles: streams, multiplexed by variant@version."""

    def __init__(self, servers: dict) -> None:
        self.servers = servers

    async def stream(self, base_model: str, request) -> AsyncIterator[dict]:
        from ray.serve.exceptions import BackPressureError

        from specserve.platform.backend import Overloaded

        key = request.target.key
        handle = self.servers[base_model].options(
            stream=True, multiplexed_model_id=str(key) if key else ""
        )
        try:
            async for event in handle.generate.remote(request.model_dump()):
                yield event
        except Exception as err:
            # Serve's queue (BackPressureError) or the replica's engine queue (Overloaded, which
            # reaches us wrapped in a RayTaskError whose `cause` it is)
            if isinstance(err, BackPressureError | Overloaded) or isinstance(
                getattr(err, "cause", None), Overloaded
            ):
                raise Overloaded(f"{base_model}: {err}") from None
            raise

    async def replica_stats(self) -> dict[str, dict]:
        out = {}
        for model, handle in self.servers.items():
            try:
                out[f"{model}/any"] = await handle.stats.remote()
            except Exception as err:  # noqa: BLE001 - stats are best effort, any replica failure
                log.warning("stats of %s: %s", model, err)
        return out


@serve.deployment
@serve.ingress(None)
class GatewayDeployment:
    """The FastAPI ingress: builds the gateway and admin API in this replica (Serve takes the app
    from `__serve_build_asgi_app__`, called after __init__)."""

    def __init__(self, args: dict, servers: dict) -> None:
        from specserve.adapters.settings import AdapterLimits
        from specserve.platform.api.admin import Admin, admin_router
        from specserve.platform.api.gateway import Gateway, create_app
        from specserve.platform.api.metrics import Metrics
        from specserve.platform.rayserve.jobs import RayJobs
        from specserve.platform.state.registry import Registry
        from specserve.policies.settings import PolicySettings

        settings = PlatformSettings.from_args(args)
        registry_store, _ = platform_stores(settings)
        registry = Registry(registry_store)
        gateway = Gateway(settings, registry, ServeBackend(servers), Metrics())
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        limits = AdapterLimits(root=settings.resolved_adapter_root())
        specs = {m: _base_spec(m, settings) for m in settings.models}
        policy = PolicySettings.from_yaml(settings.resolved_policy_file())
        admin = Admin(registry, token, specs, limits, policy, RayJobs(args))
        gateway.on_train = admin.auto_train  # the policy's requests for drafters start jobs
        self.fastapi_app = create_app(gateway, admin_router(admin))
        self.started = time.time()
        gc.freeze()  # start-up objects (torch, transformers) leave the collector's scans

    def __serve_build_asgi_app__(self):
        return self.fastapi_app


def _base_spec(model_id: str, settings: PlatformSettings):
    """Module shapes of a base model from its config alone (meta device: no weights, no memory)."""
    import torch
    import transformers

    from specserve.adapters.resident import base_model_names
    from specserve.adapters.validate import BaseModelSpec
    from specserve.models.load import default_cache_dir, pull_model

    model_dir = settings.model_dirs.get(model_id) or pull_model(
        model_id, settings.cache_dir or default_cache_dir()
    )
    config = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return BaseModelSpec.of(model, base_model_names(model_id))
