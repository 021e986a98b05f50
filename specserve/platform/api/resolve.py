"""Who may see what, and what a request's `model` names: tenant keys (`Access`), the registry
circuit breaker (`StoreBreaker`), and `Resolver`, which turns `model` into (base model, Target),
cached until the registry's generation moves and served from cache while the store is down.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from fastapi import Request

from specserve.platform.api.errors import ApiError, registry_unavailable
from specserve.platform.requests import Target
from specserve.platform.settings import PlatformSettings, TenantKeys
from specserve.platform.state.records import VariantState
from specserve.platform.state.registry import Registry, UnknownVariant
from specserve.platform.state.store import StoreError
from specserve.policies.settings import PolicySettings

log = logging.getLogger(__name__)


def bearer(http: Request) -> str | None:
    """The request's `Authorization: Bearer` key, None without one."""
    auth = http.headers.get("authorization", "")
    return auth[7:].strip() or None if auth.lower().startswith("bearer ") else None


class Access:
    """Variant visibility by API key: with tenant keys configured, a variant some tenant owns is
    visible only with that tenant's key; other variants and base models are public."""

    def __init__(self, tenant_keys: TenantKeys) -> None:
        self.keys = tenant_keys.variants_by_key
        self.owned = frozenset().union(*self.keys.values())

    def allowed(self, api_key: str | None) -> frozenset[str] | None:
        """Variants this caller may use beyond public ones (None: no tenant keys configured);
        401 for a key that is not a tenant's."""
        if not self.keys:
            return None
        if api_key is None:
            return frozenset()
        if api_key not in self.keys:
            raise ApiError(401, "invalid API key", "authentication_error", code="invalid_api_key")
        return self.keys[api_key]

    def visible(self, name: str, allowed: frozenset[str] | None) -> bool:
        return allowed is None or name not in self.owned or name in allowed


class StoreBreaker:
    """After a store failure, callers skip the store for `backoff_s` and use what they cached
    (so an unreachable store does not make every request wait for its timeout)."""

    def __init__(self, backoff_s: float = 5.0) -> None:
        self.backoff_s = backoff_s
        self._down_until = 0.0

    @property
    def open(self) -> bool:
        return time.monotonic() < self._down_until

    def trip(self) -> None:
        self._down_until = time.monotonic() + self.backoff_s

    def reset(self) -> None:
        self._down_until = 0.0


@dataclasses.dataclass(frozen=True)
class RegistryReads:
    """What the request path reads the registry with: the settings, the registry, who may see
    what, and the breaker that stops asking a store that is down."""

    settings: PlatformSettings
    registry: Registry
    access: Access
    breaker: StoreBreaker


class Resolver:
    """`model` -> (base model, Target) through the registry, one cached target per name."""

    def __init__(self, reads: RegistryReads) -> None:
        self.settings, self.registry = reads.settings, reads.registry
        self.access, self.breaker = reads.access, reads.breaker
        self._targets: dict[str, tuple[tuple[str, Target] | None, int]] = {}  # (found, generation)
        self._lock = threading.Lock()

    def resolve(self, model: str, api_key: str | None) -> tuple[str, Target]:
        """(base model, target) for a request's `model`; 404 naming `model` if unknown or hidden.
        Variant lookups are cached until the registry's generation changes; with the store down,
        the last known target keeps serving (503 only for a variant never seen)."""
        allowed = self.access.allowed(api_key)
        if model in self.settings.models:
            return model, Target()
        found = self._cached(model)
        if found is None or not self.access.visible(found[1].name, allowed):
            raise ApiError(
                404, f"The model '{model}' does not exist", param="model", code="model_not_found"
            )
        return found

    def _cached(self, model: str) -> tuple[str, Target] | None:
        with self._lock:
            entry = self._targets.get(model)
        if self.breaker.open:
            if entry is None:
                raise registry_unavailable()
            return entry[0]
        try:
            generation = self.registry.generation()  # one small read; bumped on every write
            if entry is not None and entry[1] == generation:
                return entry[0]
            found = self._lookup(model)
        except StoreError as err:
            self.breaker.trip()
            log.warning("registry unreachable (%s); serving cached variants", err)
            return self._cached(model)
        with self._lock:
            self._targets[model] = (found, generation)
        return found

    def _lookup(self, model: str) -> tuple[str, Target] | None:
        try:
            state = self.registry.variant(model)
        except (UnknownVariant, ValueError):
            return None
        if state.record.base_model not in self.settings.models:
            return None
        return state.record.base_model, _target(state, self.registry.policy_settings())


def _target(state: VariantState, policy: PolicySettings | None) -> Target:
    record = state.record
    return Target(
        **dict(state.policy_view()),
        adapter_path=record.adapter_path,
        adapter_sha256=record.adapter_sha256,
        policy=policy,
        broken=state.broken_reason,
        capture=state.capture.enabled,
    )
