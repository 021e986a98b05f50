"""The in-process `Store`: `MemoryStore`, thread-safe, every method atomic under one lock. Shared
across processes only when it lives in one actor and is reached through a `CallStore`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from specserve.platform.state.store import Store, StoreError


class _Pool(dict):
    """member -> score, in score order (scores only grow, a refreshed member moves to the end)."""


class _Samples(dict):
    """member -> score (ms), in score order."""


class MemoryStore(Store):
    """The same interface in process memory, thread-safe. Nothing is shared across processes unless
    the store lives in one actor (see `CallStore`); nothing survives the process."""

    kind = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._data: dict[str, object] = {}
        self._expiry: dict[str, float] = {}
        self._lock = threading.RLock()

    def describe(self) -> str:
        return "in-process memory store"

    def ping(self) -> None:
        return None

    def durable(self) -> bool:
        return False  # nothing survives the process

    def _live(self, key: str) -> object | None:
        deadline = self._expiry.get(key)
        if deadline is not None and time.monotonic() >= deadline:
            self._data.pop(key, None)
            self._expiry.pop(key, None)
        return self._data.get(key)

    def _typed(self, key: str, kind: type, create: bool = False):
        value = self._live(key)
        if value is None:
            if not create:
                return None
            value = self._data[key] = kind()
        if type(value) is not kind:
            raise StoreError(f"key {key!r} holds a {type(value).__name__}, not a {kind.__name__}")
        return value

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._typed(key, str)

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self._data[key] = str(value)
            self._expiry.pop(key, None)

    def delete(self, *keys: str) -> int:
        with self._lock:
            found = 0
            for key in keys:
                found += self._live(key) is not None
                self._data.pop(key, None)
                self._expiry.pop(key, None)
            return found

    def incr(self, key: str, by: int = 1) -> int:
        with self._lock:
            current = self._typed(key, str) or "0"
            try:
                value = int(current) + by
            except ValueError:
                raise StoreError(f"key {key!r} is not an integer") from None
            self._data[key] = str(value)
            return value

    def hget(self, key: str, field: str) -> str | None:
        with self._lock:
            return (self._typed(key, dict) or {}).get(field)

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        with self._lock:
            self._typed(key, dict, create=True).update({k: str(v) for k, v in mapping.items()})

    def hgetall(self, key: str) -> dict[str, str]:
        with self._lock:
            return dict(self._typed(key, dict) or {})

    def hkeys(self, key: str) -> list[str]:
        with self._lock:
            return list(self._typed(key, dict) or ())

    def hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]:
        with self._lock:
            return [dict(self._typed(key, dict) or {}) for key in keys]

    def hdel(self, key: str, *fields: str) -> int:
        with self._lock:
            found = self._typed(key, dict)
            if not found:
                return 0
            removed = sum(found.pop(f, None) is not None for f in fields)
            if not found:
                self.delete(key)
            return removed

    def hincr(self, key: str, increments: Mapping[str, int]) -> dict[str, int]:
        with self._lock:
            found = self._typed(key, dict, create=True)
            try:
                values = {f: int(found.get(f, "0")) + int(by) for f, by in increments.items()}
            except ValueError:
                raise StoreError(f"map {key!r} holds a non-integer field") from None
            found.update({f: str(v) for f, v in values.items()})
            return values

    # the parameters' types are Store.add_version's (one line here, not its signature again)
    def add_version(self, counter_key, versions_key, index_key, member, record, bump=None) -> int:
        with self._lock:
            if bump is not None:  # first, as in Redis: a wrong-typed key fails before any write
                self.incr(bump)
            version = self.incr(counter_key)
            self.hset(versions_key, {str(version): record})
            index = self._typed(index_key, dict, create=True)
            index.setdefault(member, record)
            return version

    def remove(
        self, fields: Sequence[tuple[str, str]], keys: Sequence[str], bump: str | None = None
    ) -> list[bool]:
        with self._lock:
            if bump is not None:
                self.incr(bump)
            existed = [self.hdel(key, field) > 0 for key, field in fields]
            self.delete(*keys)
            return existed

    def pool_push(self, key: str, members: Sequence[str], cap: int, ttl_s: float) -> int:
        with self._lock:
            pool: _Pool = self._typed(key, _Pool, create=True)
            score = max(int(self._clock() * 1000), max(pool.values(), default=0) + 1)
            for member in members:
                pool.pop(member, None)
                pool[member] = score
            while len(pool) > cap:
                del pool[next(iter(pool))]
            self._expiry[key] = time.monotonic() + ttl_s
            return score

    def pool_pull(self, key: str, since: int, limit: int) -> tuple[list[str], int]:
        with self._lock:
            pool: _Pool = self._typed(key, _Pool) or _Pool()
            newer = [(m, s) for m, s in pool.items() if s > since][-limit:] if limit > 0 else []
            return [m for m, _ in newer], max((s for _, s in newer), default=since)

    # the parameters' types are Store.sample_push's
    def sample_push(self, key, member, cap, retention_s, guards=()) -> int | None:
        with self._lock:
            if any(self.hget(k, f) is None for k, f in guards):
                return None
            samples = self._typed(key, _Samples, create=True)
            now = int(self._clock() * 1000)
            score = max(now, max(samples.values(), default=0) + 1)
            samples.pop(member, None)
            samples[member] = score
            self._prune(samples, now - retention_s * 1000)
            while len(samples) > cap:
                del samples[next(iter(samples))]
            self._expiry[key] = time.monotonic() + retention_s
            return score

    def sample_pull(self, key: str, retention_s: float, limit: int) -> list[str]:
        with self._lock:
            samples = self._typed(key, _Samples)
            if not samples or limit <= 0:
                return []
            self._prune(samples, self._clock() * 1000 - retention_s * 1000)
            return list(samples)[-limit:]

    @staticmethod
    def _prune(samples: _Samples, oldest_ms: float) -> None:
        for member in [m for m, score in samples.items() if score < oldest_ms]:
            del samples[member]
