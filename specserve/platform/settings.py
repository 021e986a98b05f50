"""Settings of the whole application: the Serve config's `args` plus secrets from the environment.

`PlatformSettings.from_args(args, env)` validates both (unknown arg names fail, listing the valid
ones); the environment wins for paths (SPECSERVE_POLICY_FILE, SPECSERVE_ADAPTER_ROOT).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specserve.engine.batch_settings import BatchSettings
from specserve.paths import config_file


class TenantKeys(BaseModel):
    """api key -> variant names that tenant may use. File (k8s/overlays/dev/tenants.example.yaml):
    {tenants: {NAME: {keys: [KEY, ...], variants: [VARIANT, ...]}}}; a key opens one tenant."""

    model_config = ConfigDict(extra="forbid")

    variants_by_key: dict[str, frozenset[str]] = {}

    @classmethod
    def from_file(cls, path: Path | None) -> TenantKeys:
        if path is None or not Path(path).is_file():
            return cls()
        data = yaml.safe_load(Path(path).read_text()) or {}
        by_key: dict[str, frozenset[str]] = {}
        for name, tenant in (data.get("tenants") or {}).items():
            keys = tenant.get("keys") or []
            if not keys or not all(isinstance(k, str) and k for k in keys):
                raise ValueError(
                    f"tenant keys file {path}: tenant {name!r} needs keys: [non-empty strings]"
                )
            for key in keys:
                if key in by_key:
                    raise ValueError(f"tenant keys file {path}: a key is listed for two tenants")
                by_key[key] = frozenset(tenant.get("variants") or [])
        return cls(variants_by_key=by_key)


class PlatformSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dtype_workload(self):
        """What `dtype: auto` prices for this platform's replicas and their jobs (one rule, so a
        drafter trains in the dtype it will serve in)."""
        from specserve.engine.dtype_choice import Workload

        return Workload(rows=self.dtype_rows)

    models: list[str] = Field(["smollm2-135m"], min_length=1)
    policy_file: Path | None = Field(
        None, description="policy settings YAML; None: the packaged specserve/configs/policy.yaml"
    )
    adapter_root: Path | None = None
    max_body_bytes: int = Field(1 << 20, gt=0)
    max_tokens: int = Field(1024, gt=0)
    default_max_tokens: int = Field(256, gt=0)
    max_adapters_per_replica: int | None = Field(
        None,
        gt=0,
        description="an extra cap on the adapters a replica keeps resident; None: its memory "
        "budget alone decides (Serve's multiplexing cache is sized to match either way)",
    )
    adapter_memory_fraction: float = Field(
        0.2,
        gt=0,
        le=0.9,
        description="share of the memory free at start that resident adapter weights may take",
    )
    max_inflight_per_model: int = Field(64, gt=0, description="gateway-side bound; beyond it 503")
    model_dirs: dict[str, Path] = Field(
        {}, description="served name -> local HF dir (not the catalog)"
    )
    device: str | None = None
    dtype: str = Field(
        "auto",
        description="auto (cheapest request measured here, cached), float32 (exact), bfloat16",
    )
    dtype_rows: int = Field(
        16,
        ge=1,
        description="decode rows per step `dtype: auto` prices a replica's requests at (its "
        "typical batch under load; 1 prices a request alone, as the commands do)",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile each replica's batched forward, warmed in the background while "
        "it serves eager (auto: when a measurement cached here by an earlier `on` shows it >= "
        "1.05x cheaper, and in float32 only if bit-exact)",
    )
    batch: BatchSettings = Field(BatchSettings(), description="each replica's engine loop limits")
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="intra-op threads of a model server; None: every core this process may use "
        "(Ray would otherwise pin OMP_NUM_THREADS to the actor's num_cpus, and batched forwards "
        "need the cores)",
    )
    # from the environment only
    admin_token: SecretStr | None = None
    tenant_keys: TenantKeys = TenantKeys()
    redis_url: str | None = None
    pool_redis_url: str | None = None
    cache_dir: Path | None = None

    @classmethod
    def from_args(
        cls, args: Mapping | None = None, env: Mapping[str, str] | None = None
    ) -> PlatformSettings:
        env = os.environ if env is None else env
        values = dict(args or {})
        unknown = set(values) - set(cls.model_fields) | (
            set(values) & {"admin_token", "tenant_keys", "redis_url", "pool_redis_url", "cache_dir"}
        )
        if unknown:
            allowed = sorted(
                set(cls.model_fields)
                - {"admin_token", "tenant_keys", "redis_url", "pool_redis_url", "cache_dir"}
            )
            raise ValueError(f"unknown application args {sorted(unknown)}; valid: {allowed}")
        if env.get("SPECSERVE_POLICY_FILE"):
            values["policy_file"] = env["SPECSERVE_POLICY_FILE"]
        if env.get("SPECSERVE_ADAPTER_ROOT"):
            values["adapter_root"] = env["SPECSERVE_ADAPTER_ROOT"]
        tenants_file = env.get("SPECSERVE_TENANT_KEYS_FILE")
        values.update(
            admin_token=env.get("SPECSERVE_ADMIN_TOKEN") or None,
            tenant_keys=TenantKeys.from_file(Path(tenants_file) if tenants_file else None),
            redis_url=env.get("REDIS_URL") or None,
            pool_redis_url=env.get("SPECSERVE_POOL_REDIS_URL") or env.get("REDIS_URL") or None,
            cache_dir=env.get("SPECSERVE_CACHE") or None,
        )
        return cls.model_validate(values)

    def resolved_torch_threads(self) -> int:
        if self.torch_threads is not None:
            return self.torch_threads
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )

    def resolved_policy_file(self) -> Path:
        return self.policy_file if self.policy_file is not None else config_file("policy.yaml")

    def resolved_adapter_root(self) -> Path:
        if self.adapter_root is not None:
            return self.adapter_root
        from specserve.models.load import default_cache_dir

        return (self.cache_dir or default_cache_dir()) / "adapters"
