"""A bounded n-gram pool: key tokens -> recent continuations, with LRU eviction.

Its own object so requests of one variant, and later replicas through Redis, can share it.
Thread-safe; `merge` folds another pool in as if its entries had been added. With `journal_size`
set, adds are also recorded (bounded) for `drain_journal`: how replicas ship new n-grams to Redis.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from specserve.engine.match_stats import MatchStats
from specserve.engine.node_calibration import NodeCalibration
from specserve.engine.output_index import OutputIndex

Key = tuple[int, ...]
Continuation = tuple[int, ...]


class NGramPool:
    """Maps a key (the last `key_len` tokens) to at most `max_per_key` continuations.

    Example: pool.add((5,), (6, 7)); pool.add((5,), (8, 9)); pool.get((5,), 2) -> [(8, 9), (6, 7)]
    (most recent first). Beyond `max_keys` keys, the least recently used key is evicted.
    `journal_size` > 0 keeps the last that many adds (not merges) for `drain_journal`.
    """

    def __init__(self, max_keys: int = 65536, max_per_key: int = 8, journal_size: int = 0) -> None:
        if max_keys < 1 or max_per_key < 1:
            raise ValueError("max_keys and max_per_key must be at least 1")
        if journal_size < 0:
            raise ValueError("journal_size must be >= 0")
        self.max_keys = max_keys
        self.max_per_key = max_per_key
        self._entries: OrderedDict[Key, OrderedDict[Continuation, None]] = OrderedDict()
        self._journal: deque[tuple[Key, Continuation]] | None = (
            deque(maxlen=journal_size) if journal_size else None
        )
        self._lock = threading.Lock()
        # measured acceptance of drafts from this variant's n-grams (the hybrid proposer's)
        self.match_stats = MatchStats()
        self.node_calibration = NodeCalibration()  # measured acceptance of its scored nodes
        self.outputs = OutputIndex()  # the variant's recent outputs (the hybrid's counts)

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    @property
    def num_keys(self) -> int:
        return len(self._entries)

    @property
    def journaling(self) -> bool:
        return self._journal is not None

    def add(self, key: Sequence[int], continuation: Sequence[int]) -> None:
        with self._lock:
            self._add(tuple(key), tuple(continuation))

    def drain_journal(self) -> list[tuple[Key, Continuation]]:
        """The adds recorded since the last drain, oldest first (at most `journal_size`)."""
        with self._lock:
            if not self._journal:
                return []
            drained = list(self._journal)
            self._journal.clear()
            return drained

    def _add(self, key: Key, continuation: Continuation, record: bool = True) -> None:
        if record and self._journal is not None:
            self._journal.append((key, continuation))
        conts = self._entries.get(key)
        if conts is None:
            conts = self._entries[key] = OrderedDict()
            if len(self._entries) > self.max_keys:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        conts[continuation] = None
        conts.move_to_end(continuation)
        if len(conts) > self.max_per_key:
            conts.popitem(last=False)

    def add_ngrams(
        self, tokens: Sequence[int], key_len: int, cont_len: int, start: int = 0
    ) -> None:
        """Add every n-gram of `tokens` (n = key_len + cont_len) that starts at or after `start`."""
        n = key_len + cont_len
        with self._lock:
            for i in range(max(start, 0), len(tokens) - n + 1):
                gram = tuple(tokens[i : i + n])
                self._add(gram[:key_len], gram[key_len:])

    def get(self, key: Sequence[int], limit: int) -> list[Continuation]:
        """Up to `limit` continuations for `key`, most recently added first."""
        with self._lock:
            conts = self._entries.get(tuple(key))
            if not conts:
                return []
            self._entries.move_to_end(tuple(key))
            return list(reversed(conts))[:limit]

    def items(self) -> list[tuple[Key, list[Continuation]]]:
        """A snapshot, least recently used key first, oldest continuation first."""
        with self._lock:
            return [(k, list(v)) for k, v in self._entries.items()]

    def recent(self, limit: int) -> list[tuple[Key, Continuation]]:
        """The newest `limit` (key, continuation) entries, oldest first; O(limit) under the lock."""
        out: list[tuple[Key, Continuation]] = []
        with self._lock:
            for key in reversed(self._entries):
                for cont in reversed(self._entries[key]):
                    if len(out) >= limit:
                        return out[::-1]
                    out.append((key, cont))
        return out[::-1]

    def merge(
        self,
        other: NGramPool | Iterable[tuple[Key, list[Continuation]]],
        *,
        journal: bool = True,
    ) -> None:
        """Fold `other` in, in its order; `journal=False` keeps it out of the journal (pulled data)."""
        entries = other.items() if isinstance(other, NGramPool) else other
        with self._lock:
            for key, conts in entries:
                for cont in conts:
                    self._add(tuple(key), tuple(cont), journal)
