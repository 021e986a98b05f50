"""The variant registry on a `Store`: versions (atomic, consecutive, never reused — a deleted name
re-registered continues its numbering), drafter status, acceptance figures, policy overrides and
settings. Every read goes to the store, so replicas see changes without restarting; listing many
variants costs a fixed number of round trips, not one per variant. Records: state/records.py.
A variant's captured traffic (state/traffic.py) lives beside it and is deleted with it.
"""

from __future__ import annotations

import json
import re
import time
from bisect import bisect_right
from collections.abc import Sequence

from specserve.adapters.variants import VariantKey
from specserve.platform.state.records import (
    Acceptance,
    CaptureSettings,
    DrafterKind,
    DrafterStatus,
    VariantInfo,
    VariantPage,
    VariantSpec,
    VariantState,
    VersionRecord,
    check_name,
)
from specserve.platform.state.registry_reads import (
    parse_acceptance,
    parse_capture,
    parse_drafters,
    parse_versions,
    variant_state,
)
from specserve.platform.state.store import Store, StoreError
from specserve.policies.settings import PolicySettings

_STRATEGY = re.compile(r"[a-z][a-z0-9_]{0,31}")
# what `Registry.variant` reads
_PER_VERSION = ("versions", "drafters", "acceptance", "broken", "capture")
TRAFFIC = "traffic"  # the variant's captured traffic (state/traffic.py), deleted with it


class UnknownVariant(KeyError):
    """No such variant, or no such version of it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown variant"


def check_strategy(name: str) -> str:
    if not _STRATEGY.fullmatch(name):
        raise ValueError(f"strategy {name!r}: lowercase letters, digits and '_', at most 32")
    return name


MAX_PAGE = 1000


class Registry:
    """Variants and their state under `namespace` (default "specserve") in `store`.

    Key layout (nothing expires; the registry Redis must be `noeviction`):
      <ns>:variants                      map name -> first record of the live variant (the index)
      <ns>:variant:<name>:seq            version counter; survives delete (versions continue)
      <ns>:variant:<name>:versions       map version -> VersionRecord JSON (without the version)
      <ns>:variant:<name>:drafters       map "<version>:<kind>" -> DrafterStatus JSON
      <ns>:variant:<name>:acceptance     map "<version>:<strategy>:<figure>" -> integer
      <ns>:variant:<name>:broken         map version -> why it may not be served (digest mismatch)
      <ns>:variant:<name>:capture        map "settings" -> CaptureSettings JSON; "enabled" -> 1
                                         while capture is on (the guard of every capture write)
      <ns>:variant:<name>:traffic        captured traffic, sorted by time (expires; traffic.py)
      <ns>:policy:overrides              map name -> forced strategy
      <ns>:policy:settings               policy settings JSON
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
        return self._key("variant", name, what)  # seq | versions | drafters | acceptance | ...

    def variant_key(self, name: str, what: str) -> str:
        """The store key of one of a variant's parts (`what`: versions, capture, traffic, ...)."""
        return self._variant_key(check_name(name), what)

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

    def versions(self, name: str) -> list[VersionRecord]:
        """Every version of `name`, oldest first; UnknownVariant if none."""
        check_name(name)
        raw = self.store.hgetall(self._variant_key(name, "versions"))
        if not raw:
            raise UnknownVariant(f"unknown variant {name!r}")
        return parse_versions(raw)

    def get(self, name: str, version: int | None = None) -> VersionRecord:
        """One version of `name` (the current one by default); UnknownVariant if absent."""
        if version is None:
            return self.versions(name)[-1]
        check_name(name)
        body = self.store.hget(self._variant_key(name, "versions"), str(version))
        if body is None:
            raise UnknownVariant(f"unknown variant version {name}@{version}")
        return VersionRecord(**json.loads(body), version=version)

    def variant(self, text: str) -> VariantState:
        """`name` (its current version) or `name@version` with its versions, override, and that
        version's drafters and acceptance: the one read of a variant gateway and admin make (two
        round trips). UnknownVariant if absent; ValueError for a malformed name."""
        key = VariantKey.parse(text) if "@" in text else None
        name = key.variant if key else check_name(text)
        raws = self.store.hgetall_many([self._variant_key(name, w) for w in _PER_VERSION])
        state = variant_state(name, self.override(name), key.version if key else None, *raws)
        if state is None:
            raise UnknownVariant(
                f"unknown variant version {key}" if key else f"unknown variant {name!r}"
            )
        return state

    def list(self, names: Sequence[str] | None = None) -> list[VariantInfo]:
        """These variants (default: every one, names sorted), in the order given; a name that is
        not (or no longer) registered is left out. Three reads, whatever the count."""
        names = self.names() if names is None else [check_name(n) for n in names]
        if not names:
            return []
        raw = self.store.hgetall_many([self._variant_key(n, "versions") for n in names])
        overrides = self.overrides()
        return [
            VariantInfo(name=n, versions=parse_versions(found), override=overrides.get(n))
            for n, found in zip(names, raw, strict=True)
            if found
        ]

    def page(self, limit: int, after: str | None = None) -> VariantPage:
        """At most `limit` (1..MAX_PAGE) variants (current versions, as `variant` reads them)
        with names after `after` (exclusive; any string, so a cursor stays valid when its variant
        is deleted), in name order. Three reads, whatever the count."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit: 1 to {MAX_PAGE}")
        names = self.names()
        start = bisect_right(names, after) if after is not None else 0
        chosen = names[start : start + limit]
        keys = [self._variant_key(n, w) for n in chosen for w in _PER_VERSION]
        raws, w = self.store.hgetall_many(keys) if chosen else [], len(_PER_VERSION)
        overrides = self.overrides() if chosen else {}
        states = [
            variant_state(n, overrides.get(n), None, *raws[w * i : w * i + w])
            for i, n in enumerate(chosen)
        ]
        found = [s for s in states if s is not None]  # deleted since the names were read
        return VariantPage(variants=found, has_more=start + limit < len(names))

    def delete(self, name: str) -> bool:
        """Remove `name` with its versions, drafter status, acceptance, override, capture settings
        and captured traffic, in one atomic step; whether it existed. Its version counter stays:
        a later registration continues the numbering, so drafters, pools and cached routes of old
        versions can never match the new variant (nor a capture still in flight land in it)."""
        check_name(name)
        existed = self.store.remove(
            [(self._index, name), (self._overrides, name)],
            [self._variant_key(name, w) for w in (*_PER_VERSION, TRAFFIC)],
            self._generation,
        )[0]
        return existed

    def mark_broken(self, key: VariantKey, reason: str) -> None:
        """Record that `key` may not be served (its adapter's bytes are not the registered
        ones); gateways refuse it from their next registry read. A new version is not broken."""
        self._require(key)
        self.store.hset(self._variant_key(key.variant, "broken"), {str(key.version): reason})
        self._changed()

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
        return parse_drafters(key, self.store.hgetall(self._variant_key(key.variant, "drafters")))

    # -- traffic capture
    def set_capture(self, name: str, settings: CaptureSettings) -> CaptureSettings:
        """Turn `name`'s traffic capture on or off and set its bounds (every version)."""
        self.get(name)
        key = self._variant_key(name, "capture")
        self.store.hset(key, {"settings": settings.model_dump_json()})
        if settings.enabled:
            self.store.hset(key, {"enabled": "1"})
        else:
            self.store.hdel(key, "enabled")
        self._changed()
        return settings

    def capture(self, name: str) -> CaptureSettings:
        """`name`'s capture settings (off unless an admin turned it on)."""
        raw = self.store.hgetall(self._variant_key(check_name(name), "capture"))
        return parse_capture(raw)

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
        costed_tokens: int = 0,
        cost_milli: int = 0,
    ) -> Acceptance:
        """Add one batch of figures (non-negative) for `strategy` on `key`; the new totals.
        Model servers should aggregate locally and flush periodically, not call this per token."""
        check_strategy(strategy)
        add = {
            "tokens": tokens,
            "forwards": forwards,
            "drafted": drafted,
            "accepted": accepted,
            "costed_tokens": costed_tokens,
            "cost_milli": cost_milli,
        }
        if any(v < 0 for v in add.values()):
            raise ValueError("acceptance figures must be >= 0")
        values = self.store.hincr(
            self._variant_key(key.variant, "acceptance"),
            {f"{key.version}:{strategy}:{f}": v for f, v in add.items()},
        )
        return Acceptance(**{k.rsplit(":", 1)[1]: v for k, v in values.items()})

    def acceptance(self, key: VariantKey) -> dict[str, Acceptance]:
        """strategy -> accumulated figures on `key`."""
        return parse_acceptance(
            key, self.store.hgetall(self._variant_key(key.variant, "acceptance"))
        )

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

    def set_policy_settings(self, settings: PolicySettings) -> None:
        """Store the policy settings every replica applies (instead of its configs/policy.yaml)."""
        self.store.set(self._settings, settings.model_dump_json())
        self._changed()

    def policy_settings(self) -> PolicySettings | None:
        """The stored policy settings; None if an admin never set them."""
        body = self.store.get(self._settings)
        return PolicySettings.model_validate_json(body) if body else None
