"""Settings of the whole application: the Serve config's `args` plus what the environment sets.

`PlatformSettings.from_args(args, env)` validates both (unknown arg names fail, listing the valid
ones). `Environment` reads the environment with pydantic-settings: secrets, store addresses and
the cache come only from there; it wins for paths (SPECSERVE_POLICY_FILE, SPECSERVE_ADAPTER_ROOT).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from specserve.engine.batch.settings import BatchSettings
from specserve.env import EnvVar
from specserve.paths import config_file, default_cache_dir

ENV_ONLY = frozenset(
    {
        "admin_token",
        "tenant_keys",
        "redis_url",
        "pool_redis_url",
        "redis_embedded",
        "cache_dir",
        "fault_injection",
    }
)


class MappingSource(PydanticBaseSettingsSource):
    """A settings source over one mapping of variables (`os.environ` or a given one, so `env={}`
    means no environment at all): each field's variable is its alias; an empty one is unset."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        name = str(field.alias or field_name)
        return self.env.get(name) or None, name, False

    def __call__(self) -> dict[str, Any]:
        found = (self.get_field_value(f, n) for n, f in self.settings_cls.model_fields.items())
        return {name: value for value, name, _ in found if value is not None}


class Environment(BaseSettings):
    """The variables specserve reads (`EnvVar`); an empty one counts as unset. `read(env)` takes
    them from `env` (default: the process environment), nothing else: no .env file, no secrets
    dir."""

    model_config = SettingsConfigDict(frozen=True)

    admin_token: SecretStr | None = Field(None, alias=EnvVar.ADMIN_TOKEN)
    tenant_keys_file: Path | None = Field(None, alias=EnvVar.TENANT_KEYS_FILE)
    redis_url: SecretStr | None = Field(None, alias=EnvVar.REDIS_URL)
    pool_redis_url: SecretStr | None = Field(None, alias=EnvVar.POOL_REDIS_URL)
    redis_embedded: bool = Field(False, alias=EnvVar.REDIS_EMBEDDED)
    cache_dir: Path | None = Field(None, alias=EnvVar.CACHE)
    policy_file: Path | None = Field(None, alias=EnvVar.POLICY_FILE)
    adapter_root: Path | None = Field(None, alias=EnvVar.ADAPTER_ROOT)
    fault_injection: bool = Field(False, alias=EnvVar.FAULT_INJECTION)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings,)  # the variables come in through `read`, from one mapping

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> Environment:
        return cls(**MappingSource(cls, os.environ if env is None else env)())

    def platform_values(self) -> dict:
        """`PlatformSettings` fields from here: the env-only ones, and the paths that are set."""
        paths = {"policy_file": self.policy_file, "adapter_root": self.adapter_root}
        return {k: v for k, v in paths.items() if v is not None} | {
            "admin_token": self.admin_token,
            "tenant_keys": TenantKeys.from_file(self.tenant_keys_file),
            "redis_url": _plain(self.redis_url),
            "pool_redis_url": _plain(self.pool_redis_url or self.redis_url),
            "redis_embedded": self.redis_embedded,
            "cache_dir": self.cache_dir,
            "fault_injection": self.fault_injection,
        }


def _plain(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


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
    """Everything a gateway, a model server or a drafter job of this application is set up from."""

    model_config = ConfigDict(extra="forbid")

    def dtype_workload(self):
        """What `dtype: auto` prices for this platform's replicas and their jobs (one rule, so a
        drafter trains in the dtype it will serve in)."""
        from specserve.engine.tuning.dtype_choice import Workload  # lazy: torch (about 3 s)

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
        description="auto (fastest serving step under load measured here, cached), float32 "
        "(exact), bfloat16",
    )
    dtype_rows: int = Field(
        16,
        ge=1,
        description="requests decoding together in the serving step `dtype: auto` times (a "
        "replica's batch under load; the commands use 16 too)",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile each replica's batched forward, warmed in the background while "
        "it serves eager (auto: when a measurement cached here by an earlier `on` shows it >= "
        "1.05x cheaper, and in float32 only if bit-exact)",
    )
    batch: BatchSettings = Field(BatchSettings(), description="each replica's engine loop limits")
    engine_stall_s: float = Field(
        60.0,
        gt=0,
        description="a model server's health check fails when its engine loop holds work and "
        "has not finished a step for this long (hung), as when the loop thread died",
    )
    retry_within_s: float = Field(
        30.0,
        gt=0,
        description="a request whose replica died before its first token is sent once more; "
        "that retry must start streaming within this long (a replacement starting), else 503",
    )
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        description="drain: after SIGTERM/SIGINT (or a replica's graceful stop) new requests get "
        "503 + Retry-After and in-flight ones have this long to finish; the rest end with an error",
    )
    store: Literal["redis", "memory"] = Field(
        "redis",
        description="where the registry and the n-gram pools live. redis: REDIS_URL (under "
        "`specserve up` without it: a private redis-server, refused when there is none); memory: "
        "an in-cluster memory store that keeps nothing (a test and dev aid; `up --store memory`)",
    )
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
    redis_embedded: bool = False  # REDIS_URL is the private redis-server of `specserve up`
    cache_dir: Path | None = None
    fault_injection: bool = False  # POST /admin/faults (the fault suite); never in production

    @classmethod
    def from_args(
        cls, args: Mapping | None = None, env: Mapping[str, str] | None = None
    ) -> PlatformSettings:
        """`args` (the Serve config's; env-only names refused) plus `Environment.read(env)`."""
        values = dict(args or {})
        valid = sorted(set(cls.model_fields) - ENV_ONLY)
        unknown = set(values) - set(valid)
        if unknown:
            raise ValueError(f"unknown application args {sorted(unknown)}; valid: {valid}")
        return cls.model_validate(values | Environment.read(env).platform_values())

    @model_validator(mode="after")
    def _one_store(self) -> PlatformSettings:
        if self.store == "memory" and self.redis_url:
            raise ValueError("store: memory and REDIS_URL are both set: unset one of them")
        return self

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
        return self.resolved_cache_dir() / "adapters"

    def resolved_cache_dir(self) -> Path:
        """The platform's cache: SPECSERVE_CACHE as settings read it, else the default."""
        return self.cache_dir or default_cache_dir()
