"""The variant registry on a `Store`: versions (atomic, consecutive, never reused — a deleted name
re-registered continues its numbering), drafter status, acceptance figures, policy overrides and
settings, tenant keys. Every read goes to the store, so replicas see changes without restarting;
listing many variants costs a fixed number of round trips, not one per variant.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specserve.adapters.variants import VariantKey
from specserve.platform.state.store import Store, StoreError

DrafterKind = Literal["medusa", "eagle"]
DrafterState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
ACCEPTANCE_FIELDS = ("tokens", "forwards", "drafted", "accepted")

_BASE_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_STRATEGY = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
HintValue = str | int | float | bool


class UnknownVariant(KeyError):
    """No such variant, or no such version of it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown variant"


def check_name(name: str) -> str:
    """A variant name by VariantKey's rules (1-64 letters, digits, '_' or '-'); ValueError if not."""
    VariantKey(name, 1)
    return name


def check_strategy(name: str) -> str:
    if not _STRATEGY.fullmatch(name):
        raise ValueError(f"strategy {name!r}: lowercase letters, digits and '_', at most 32")
    return name


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VariantSpec(_Record):
    """What an admin registers: every registration of a name is its next version."""

    name: str
    base_model: str
    adapter_path: str = Field(min_length=1, max_length=4096)
    adapter_sha256: str
    hints: dict[str, HintValue] = Field(default_factory=dict, description="policy hints")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("base_model")
    @classmethod
    def _base(cls, v: str) -> str:
        if not _BASE_MODEL.fullmatch(v):
            raise ValueError(f"base model {v!r}: 1-128 letters, digits, '_', '.' or '-'")
        return v

    @field_validator("adapter_sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not _SHA256.fullmatch(v):
            raise ValueError("adapter_sha256: 64 lowercase hex digits")
        return v

    @field_validator("hints")
    @classmethod
    def _hints(cls, v: dict[str, HintValue]) -> dict[str, HintValue]:
        long = any(len(k) > 64 or (isinstance(x, str) and len(x) > 256) for k, x in v.items())
        if len(v) > 32 or long:
            raise ValueError("hints: at most 32, keys up to 64 characters, strings up to 256")
        return v


class VersionRecord(VariantSpec):
    """One registered version. Reads ignore fields they do not know (written by newer code)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int = Field(ge=1)
    created_at: float = Field(description="registration time, seconds since the epoch")

    @property
    def key(self) -> VariantKey:
        return VariantKey(self.name, self.version)


class DrafterStatus(_Record):
    """Drafter training for one variant@version and kind, as the training job reports it.
    Unknown fields are ignored (records written by newer code stay readable)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: DrafterKind
    state: DrafterState
    progress: float = Field(0.0, ge=0.0, le=1.0)
    artifact_dir: str | None = None
    tau: float | None = Field(None, ge=0.0, description="held-out tokens per target forward")
    error: str | None = None
    updated_at: float = 0.0


class Acceptance(_Record):
    """Accumulated figures of one strategy on one variant@version."""

    tokens: int = 0
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def tau(self) -> float | None:
        """Tokens per target forward (None before any forward)."""
        return self.tokens / self.forwards if self.forwards else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class VariantInfo(_Record):
    """A variant as `show` gives it: every version (oldest first), the current one, the override."""

    name: str
    versions: list[VersionRecord]
    override: str | None = None

    @property
    def current(self) -> VersionRecord:
        return self.versions[-1]


class VariantPage(_Record):
    """One page of variants in name order: at most `limit` after the cursor, and whether more
    follow (pass the last name as the next cursor)."""

    variants: list[VariantInfo]
    has_more: bool


MAX_PAGE = 1000


class Registry:
    """Variants and their state under `namespace` (default "specserve") in `store`.

    Key layout (nothing expires; the registry Redis must be `noeviction`):
      <ns>:variants                      map name -> first record of the live variant (the index)
      <ns>:variant:<name>:seq            version counter; survives delete (versions continue)
      <ns>:variant:<name>:versions       map version -> VersionRecord JSON (without the version)
      <ns>:variant:<name>:drafters       map "<version>:<kind>" -> DrafterStatus JSON
      <ns>:variant:<name>:acceptance     map "<version>:<strategy>:<figure>" -> integer
      <ns>:policy:overrides              map name -> forced strategy
      <ns>:policy:settings               policy settings JSON
      <ns>:tenants                       map sha256(api key) -> JSON list of model names
      <ns>:generation                    counter bumped by every change (cache invalidation)
    """

    def __init__(self, store: Store, namespace: str = "specserve", clock=time.time) -> None:
        self.store = store
        self.ns = namespace
        self._clock = clock

    # -- keys: never expire; the registry store must not evict.
    def _key(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    def _variant_key(self, name: str, what: str) -> str:
        return self._key("variant", name, what)  # seq | versions | drafters | acceptance

    @property
    def _index(self) -> str:
        return self._key("variants")

    @property
    def _generation(self) -> str:
        return self._key("generation")

    @property
    def _overrides(self) -> str:
        return self._key("policy", "overrides")

    @property
    def _settings(self) -> str:
        return self._key("policy", "settings")

    @property
    def _tenants(self) -> str:
        return self._key("tenants")

    def _changed(self) -> None:
        self.store.incr(self._generation)

    def generation(self) -> int:
        """A counter that grows on every change of variants, overrides or settings: poll it to
        know when a cached view is stale."""
        return int(self.store.get(self._generation) or 0)

    def health(self) -> dict:
        """{"status": "ok"|"unavailable", "store", "latency_ms", "error"}: one ping, for /healthz
        and the registry-health metric. Never raises."""
        start = time.perf_counter()
        try:
            self.store.ping()
        except StoreError as err:
            return {"status": "unavailable", "store": self.store.describe(), "error": str(err)}
        latency = round((time.perf_counter() - start) * 1000, 3)
        return {"status": "ok", "store": self.store.describe(), "latency_ms": latency}

    # -- variants
    def register(self, spec: VariantSpec) -> VersionRecord:
        """Add the next version of `spec.name` (1 for a new name). Atomic under concurrency."""
        created_at = self._clock()
        body = spec.model_dump(mode="json") | {"created_at": created_at}
        version = self.store.add_version(
            self._variant_key(spec.name, "seq"),
            self._variant_key(spec.name, "versions"),
            self._index,
            spec.name,
            json.dumps(body, sort_keys=True),
            self._generation,  # in the same atomic step: no cache can miss a registration
        )
        return VersionRecord(**body, version=version)

    def names(self) -> list[str]:
        """Every live variant's name, sorted: the index's fields only (one read)."""
        return sorted(self.store.hkeys(self._index))

    @staticmethod
    def _parse_versions(raw: dict[str, str]) -> list[VersionRecord]:
        return sorted(
            (VersionRecord(**json.loads(body), version=int(v)) for v, body in raw.items()),
            key=lambda r: r.version,
        )

    def versions(self, name: str) -> list[VersionRecord]:
        """Every version of `name`, oldest first; UnknownVariant if none."""
        check_name(name)
        raw = self.store.hgetall(self._variant_key(name, "versions"))
        if not raw:
            raise UnknownVariant(f"unknown variant {name!r}")
        return self._parse_versions(raw)

    def get(self, name: str, version: int | None = None) -> VersionRecord:
        """One version of `name` (the current one by default); UnknownVariant if absent."""
        if version is None:
            return self.versions(name)[-1]
        check_name(name)
        body = self.store.hget(self._variant_key(name, "versions"), str(version))
        if body is None:
            raise UnknownVariant(f"unknown variant version {name}@{version}")
        return VersionRecord(**json.loads(body), version=version)

    def resolve(self, text: str) -> VersionRecord:
        """`name` (current version) or `name@version` -> its record; UnknownVariant if absent."""
        if "@" in text:
            key = VariantKey.parse(text)
            return self.get(key.variant, key.version)
        return self.get(text)

    def show(self, name: str) -> VariantInfo:
        return VariantInfo(name=name, versions=self.versions(name), override=self.override(name))

    def list(self, names: Sequence[str] | None = None) -> list[VariantInfo]:
        """These variants (default: every one, names sorted), in the order given; a name that is
        not (or no longer) registered is left out. Three reads, whatever the count."""
        names = self.names() if names is None else [check_name(n) for n in names]
        if not names:
            return []
        raw = self.store.hgetall_many([self._variant_key(n, "versions") for n in names])
        overrides = self.overrides()
        return [
            VariantInfo(name=n, versions=self._parse_versions(found), override=overrides.get(n))
            for n, found in zip(names, raw, strict=True)
            if found
        ]

    def page(self, limit: int, after: str | None = None) -> VariantPage:
        """At most `limit` (1..MAX_PAGE) variants with names after `after` (exclusive; any
        string, so a cursor stays valid when its variant is deleted), in name order."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit: 1 to {MAX_PAGE}")
        names = self.names()
        start = bisect_right(names, after) if after is not None else 0
        chosen = names[start : start + limit]
        return VariantPage(variants=self.list(chosen), has_more=start + limit < len(names))

    def delete(self, name: str) -> bool:
        """Remove `name` with its versions, drafter status, acceptance and override; whether it
        existed. Its version counter stays: a later registration continues the numbering, so
        drafters, pools and cached routes of old versions can never match the new variant."""
        check_name(name)
        existed = self.store.remove(
            [(self._index, name), (self._overrides, name)],
            [self._variant_key(name, w) for w in ("versions", "drafters", "acceptance")],
            self._generation,
        )[0]
        return existed

    def _require(self, key: VariantKey) -> None:
        if self.store.hget(self._variant_key(key.variant, "versions"), str(key.version)) is None:
            raise UnknownVariant(f"unknown variant version {key}")

    # -- drafters
    def set_drafter(self, key: VariantKey, status: DrafterStatus) -> DrafterStatus:
        """Record the status of the `status.kind` drafter of `key` (stamped now)."""
        self._require(key)
        status = status.model_copy(update={"updated_at": self._clock()})
        field = f"{key.version}:{status.kind}"
        self.store.hset(
            self._variant_key(key.variant, "drafters"), {field: status.model_dump_json()}
        )
        self._changed()
        return status

    def drafter(self, key: VariantKey, kind: DrafterKind) -> DrafterStatus | None:
        body = self.store.hget(self._variant_key(key.variant, "drafters"), f"{key.version}:{kind}")
        return DrafterStatus.model_validate_json(body) if body else None

    def drafters(self, key: VariantKey) -> dict[str, DrafterStatus]:
        """kind -> status of every drafter of `key`."""
        return _drafters(key, self.store.hgetall(self._variant_key(key.variant, "drafters")))

    def drafters_of(self, keys: Sequence[VariantKey]) -> list[dict[str, DrafterStatus]]:
        """`drafters` of each key, in one read."""
        raws = self.store.hgetall_many([self._variant_key(k.variant, "drafters") for k in keys])
        return [_drafters(key, raw) for key, raw in zip(keys, raws, strict=True)]

    # -- acceptance
    def record_acceptance(
        self,
        key: VariantKey,
        strategy: str,
        *,
        tokens: int = 0,
        forwards: int = 0,
        drafted: int = 0,
        accepted: int = 0,
    ) -> Acceptance:
        """Add one batch of figures (non-negative) for `strategy` on `key`; the new totals.
        Model servers should aggregate locally and flush periodically, not call this per token."""
        check_strategy(strategy)
        add = {"tokens": tokens, "forwards": forwards, "drafted": drafted, "accepted": accepted}
        if any(v < 0 for v in add.values()):
            raise ValueError("acceptance figures must be >= 0")
        values = self.store.hincr(
            self._variant_key(key.variant, "acceptance"),
            {f"{key.version}:{strategy}:{f}": v for f, v in add.items()},
        )
        return Acceptance(**{k.rsplit(":", 1)[1]: v for k, v in values.items()})

    def acceptance(self, key: VariantKey) -> dict[str, Acceptance]:
        """strategy -> accumulated figures on `key`."""
        return _acceptance(key, self.store.hgetall(self._variant_key(key.variant, "acceptance")))

    def acceptance_of(self, keys: Sequence[VariantKey]) -> list[dict[str, Acceptance]]:
        """`acceptance` of each key, in one read."""
        raws = self.store.hgetall_many([self._variant_key(k.variant, "acceptance") for k in keys])
        return [_acceptance(key, raw) for key, raw in zip(keys, raws, strict=True)]

    # -- policy
    def set_override(self, name: str, strategy: str | None) -> None:
        """Force `strategy` for every version of `name`, or (None) let the policy decide again."""
        self.get(name)
        if strategy is None:
            self.store.hdel(self._overrides, name)
        else:
            self.store.hset(self._overrides, {name: check_strategy(strategy)})
        self._changed()

    def override(self, name: str) -> str | None:
        return self.store.hget(self._overrides, name)

    def overrides(self) -> dict[str, str]:
        return self.store.hgetall(self._overrides)

    def set_policy_settings(self, settings: dict[str, Any]) -> None:
        """Store the policy settings (a JSON object; the policy module validates its shape)."""
        self.store.set(self._settings, json.dumps(settings, sort_keys=True))
        self._changed()

    def policy_settings(self) -> dict[str, Any] | None:
        body = self.store.get(self._settings)
        return json.loads(body) if body else None

    # -- tenants: only sha256 of each key is stored
    @staticmethod
    def tenant_id(api_key: str) -> str:
        return hashlib.sha256(api_key.encode()).hexdigest()

    def set_tenant(self, api_key: str, variants: list[str]) -> None:
        """Allow `api_key` exactly these model names (variants or base models), replacing what it
        had."""
        if not api_key:
            raise ValueError("tenant key must not be empty")
        bad = [v for v in variants if not _BASE_MODEL.fullmatch(v)]
        if bad:
            raise ValueError(f"tenant models: invalid names {bad}")
        names = sorted(set(variants))
        self.store.hset(self._tenants, {self.tenant_id(api_key): json.dumps(names)})

    def tenant_variants(self, api_key: str) -> frozenset[str] | None:
        """The variants `api_key` may use; None for a key that is not a tenant's."""
        body = self.store.hget(self._tenants, self.tenant_id(api_key))
        return frozenset(json.loads(body)) if body is not None else None

    def delete_tenant(self, api_key: str) -> bool:
        return self.store.hdel(self._tenants, self.tenant_id(api_key)) > 0

    def tenant_count(self) -> int:
        return len(self.store.hgetall(self._tenants))


def _drafters(key: VariantKey, raw: dict[str, str]) -> dict[str, DrafterStatus]:
    prefix = f"{key.version}:"
    return {
        f[len(prefix) :]: DrafterStatus.model_validate_json(body)
        for f, body in sorted(raw.items())
        if f.startswith(prefix)
    }


def _acceptance(key: VariantKey, raw: dict[str, str]) -> dict[str, Acceptance]:
    figures: dict[str, dict[str, int]] = {}
    for f, value in raw.items():
        version, strategy, name = f.split(":", 2)
        if version == str(key.version) and name in ACCEPTANCE_FIELDS:
            figures.setdefault(strategy, {})[name] = int(value)
    return {s: Acceptance(**v) for s, v in sorted(figures.items())}
