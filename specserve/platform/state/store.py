"""The state store behind the registry and the shared n-gram pools: the `Store` interface and its
errors. Implementations: `RedisStore` (redis_store), `MemoryStore` (memory_store) and `CallStore`
(call_store: a store behind a call, e.g. a MemoryStore in a Ray actor). Every method is atomic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence


class StoreError(RuntimeError):
    """A store operation failed."""


class StoreUnavailable(StoreError):
    """The store could not be reached (connection refused, timeout, authentication)."""


class Store(ABC):
    """What the registry and pool sync need. Keys and fields are strings; values are strings.

    Documents: get/set/delete. Maps: hget/hset/hgetall/hdel/hincr, and in one round trip each
    hkeys/hgetall_many (listing many variants must not cost a round trip per variant). Counters: incr.
    Compound atomic steps: `add_version`, `remove`. Pools (sorted by recency, bounded, expiring):
    `pool_push`, `pool_pull`. Samples (bounded, each kept for a retention, written only while
    guard fields exist): `sample_push`, `sample_pull`. Failures to reach the store raise
    `StoreUnavailable`.
    """

    kind: str = "store"

    @abstractmethod
    def ping(self) -> None: ...

    @abstractmethod
    def describe(self) -> str:
        """Where the store is, for logs (never a password)."""

    def durable(self) -> bool | None:
        """Whether what is written survives a restart of the store (None: it cannot say).
        May reach the store; raises `StoreUnavailable` as any call."""
        return None

    def close(self) -> None:  # noqa: B027 (a default: most stores hold nothing to release)
        """Release connections; the store may not be used afterwards."""

    # -- documents and counters
    @abstractmethod
    def get(self, key: str) -> str | None: ...

    @abstractmethod
    def set(self, key: str, value: str) -> None: ...

    @abstractmethod
    def delete(self, *keys: str) -> int:
        """Delete whole keys (any type); the number that existed."""

    @abstractmethod
    def incr(self, key: str, by: int = 1) -> int: ...

    # -- maps
    @abstractmethod
    def hget(self, key: str, field: str) -> str | None: ...

    @abstractmethod
    def hset(self, key: str, mapping: Mapping[str, str]) -> None: ...

    @abstractmethod
    def hgetall(self, key: str) -> dict[str, str]: ...

    @abstractmethod
    def hkeys(self, key: str) -> list[str]:
        """The fields of a map (no values); [] if absent."""

    @abstractmethod
    def hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]:
        """`hgetall` of every key, read together as one snapshot, in the order given."""

    @abstractmethod
    def hdel(self, key: str, *fields: str) -> int: ...

    @abstractmethod
    def hincr(self, key: str, increments: Mapping[str, int]) -> dict[str, int]:
        """Add each increment to its field (missing fields count from 0), all at once; new values."""

    # -- compound steps of the registry
    @abstractmethod
    def add_version(
        self,
        counter_key: str,
        versions_key: str,
        index_key: str,
        member: str,
        record: str,
        bump: str | None = None,
    ) -> int:
        """Atomically: n = ++counter; versions[n] = record; index[member] = record if absent;
        ++bump (a change counter) if given. -> n"""

    @abstractmethod
    def remove(
        self, fields: Sequence[tuple[str, str]], keys: Sequence[str], bump: str | None = None
    ) -> list[bool]:
        """Atomically delete map fields (key, field) and whole keys, and ++bump if given; per
        field, whether it existed."""

    # -- shared pools
    @abstractmethod
    def pool_push(self, key: str, members: Sequence[str], cap: int, ttl_s: float) -> int:
        """Add or refresh members under one new score (strictly above every score already in the
        pool, normally the store's clock in ms), keep the `cap` most recent, expire the pool
        `ttl_s` after this push. -> the score."""

    @abstractmethod
    def pool_pull(self, key: str, since: int, limit: int) -> tuple[list[str], int]:
        """Members with score > since, oldest first (the newest `limit` if more), and the highest
        score seen (`since` when none): pass it back as `since` for the next pull."""

    # -- retained samples (captured traffic)
    @abstractmethod
    def sample_push(
        self,
        key: str,
        member: str,
        cap: int,
        retention_s: float,
        guards: Sequence[tuple[str, str]] = (),
    ) -> int | None:
        """Atomically, only if every map field (key, field) of `guards` exists: add `member`
        under a new score (the store's clock in ms, strictly above every score in the set), drop
        members older than `retention_s`, keep the `cap` newest, expire the set `retention_s`
        after this push. -> the score; None (nothing written) when a guard is missing."""

    @abstractmethod
    def sample_pull(self, key: str, retention_s: float, limit: int) -> list[str]:
        """Drop members older than `retention_s` (store clock), then the newest `limit` of the
        rest, oldest first."""
