"""A variant at a version (`support-bot@3`) and the per-variant state keyed by it.

Everything speculation learns about a variant (its n-gram pool, its drafter heads) belongs to one
version: a new version starts cold and a drafter trained for another version is refused.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from specserve.engine.ngram_pool import NGramPool

_VARIANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")


@dataclass(frozen=True, order=True)
class VariantKey:
    """`variant@version`; also the name its adapter is resident under."""

    variant: str
    version: int

    def __post_init__(self) -> None:
        if not _VARIANT.fullmatch(self.variant):
            raise ValueError(f"variant name {self.variant!r}: 1-64 letters, digits, '_' or '-'")
        if self.version < 1:
            raise ValueError(f"variant version must be >= 1, not {self.version}")

    def __str__(self) -> str:
        return f"{self.variant}@{self.version}"

    @classmethod
    def parse(cls, text: str) -> VariantKey:
        """Example: "support-bot@3" -> VariantKey("support-bot", 3)."""
        variant, sep, version = text.rpartition("@")
        if not sep or not version.isdigit():
            raise ValueError(f"variant key {text!r}: expected NAME@VERSION, e.g. support-bot@3")
        return cls(variant, int(version))


class PoolBook:
    """One n-gram pool per variant@version (base model = key None), at most `max_pools`, LRU."""

    def __init__(self, max_pools: int = 64, **pool_kwargs) -> None:
        self.max_pools = max_pools
        self._pool_kwargs = pool_kwargs
        self._pools: OrderedDict[VariantKey | None, NGramPool] = OrderedDict()
        self._lock = threading.Lock()

    def pool(self, key: VariantKey | None) -> NGramPool:
        """The pool of `key`, created empty on first use; the least recently used is dropped."""
        with self._lock:
            if key not in self._pools:
                self._pools[key] = NGramPool(**self._pool_kwargs)
                while len(self._pools) > self.max_pools:
                    self._pools.popitem(last=False)
            self._pools.move_to_end(key)
            return self._pools[key]

    def peek(self, key: VariantKey | None) -> NGramPool | None:
        """The pool of `key` if it exists, without creating it or touching its recency."""
        with self._lock:
            return self._pools.get(key)

    @property
    def journaling(self) -> bool:
        """Whether its pools record adds for `drain_journal` (made with journal_size > 0)."""
        return self._pool_kwargs.get("journal_size", 0) > 0

    def keys(self) -> list[VariantKey | None]:
        with self._lock:
            return list(self._pools)
