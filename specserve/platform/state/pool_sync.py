"""Shares the n-gram pools of a `PoolBook` across replicas through a `Store`, in one background
thread: it pushes each pool's new n-grams and pulls what other replicas pushed. Inference never
waits on the store; with it unreachable the thread reports `degraded`, keeps local state, backs off
and resyncs by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from specserve.adapters.variants import PoolBook, VariantKey
from specserve.engine.ngram_pool import Continuation, Key, NGramPool
from specserve.platform.state.store import Store

log = logging.getLogger(__name__)

Entry = tuple[Key, Continuation]


class PoolSyncSettings(BaseModel):
    """How often and how much the shared pools sync (pools live in the evicting Redis)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(2.0, gt=0, description="seconds between sync rounds")
    max_entries: int = Field(
        20000, ge=1, description="n-grams kept per shared pool (least recent evicted)"
    )
    ttl_s: float = Field(
        7 * 86400.0, gt=0, description="a shared pool vanishes this long after its last push"
    )
    pull_limit: int = Field(20000, ge=1, description="most n-grams taken from one pull")
    max_backoff_s: float = Field(30.0, gt=0, description="longest wait between failed rounds")
    namespace: str = "specserve"


def encode(key: Key, cont: Continuation) -> str:
    """((5, 6), (7,)) -> "5,6|7"."""
    return ",".join(map(str, key)) + "|" + ",".join(map(str, cont))


def decode(member: str) -> Entry | None:
    """Inverse of `encode`; None for a malformed member."""
    key, sep, cont = member.partition("|")
    try:
        parsed = tuple(map(int, key.split(","))), tuple(map(int, cont.split(",")))
    except ValueError:
        return None
    return parsed if sep else None


def group(entries: Iterable[Entry]) -> list[tuple[Key, list[Continuation]]]:
    """Entries in order -> NGramPool.merge's shape, one item per entry (keeps recency order)."""
    return [(k, [c]) for k, c in entries]


class _PoolState:
    """What the thread remembers of one local pool: n-grams not yet pushed, the pull cursor."""

    def __init__(self) -> None:
        self.pending: OrderedDict[str, None] = OrderedDict()
        self.since = 0  # highest shared score pulled; 0 = never pulled (a full pull)

    def queue(self, members: Iterable[str], cap: int) -> None:
        for m in members:
            self.pending[m] = None
            self.pending.move_to_end(m)
        while len(self.pending) > cap:
            self.pending.popitem(last=False)


class PoolSync:
    """Syncs every pool of `book` with `store` every `settings.interval_s` once `start()`ed.

    The book's pools must journal their adds (PoolBook(..., journal_size=N)). Pools are keyed
    per variant@version (`<ns>:pool:v:<name>@<version>`); the base model's pool (key None) is
    shared as `<ns>:pool:base:<base_model>` when `base_model` is given.
    """

    def __init__(
        self,
        store: Store,
        book: PoolBook,
        settings: PoolSyncSettings | None = None,
        *,
        base_model: str | None = None,
    ) -> None:
        if not book.journaling:
            raise ValueError("PoolSync needs a PoolBook whose pools journal: pass journal_size > 0")
        self.store = store
        self.book = book
        self.settings = settings or PoolSyncSettings()
        self.base_model = base_model
        self._states: dict[VariantKey | None, _PoolState] = {}
        self._lock = threading.Lock()  # guards health, counters and round bookkeeping
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._round_done = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._status = "starting"
        self._last_ok: float | None = None
        self._last_error: str | None = None
        self._degraded_since: float | None = None
        self._rounds = 0  # rounds finished (ok or not)
        self._in_round = False  # a round is running (it may have missed a just-made pool)
        self._round_ok: dict[int, bool] = {}
        self._failures_in_row = 0
        self._resync = False  # push full snapshots on the next good round (store may be empty)
        self._counts = dict.fromkeys(
            ("rounds", "pushes", "pulls", "pushed_ngrams", "pulled_ngrams", "failures"), 0
        )

    # ---------------------------------------------------------------------------- lifecycle
    def start(self) -> PoolSync:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="specserve-pool-sync", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------------------- requests
    def sync_now(self, timeout_s: float = 5.0) -> bool:
        """Ask for a round that starts after this call and wait up to `timeout_s` for it;
        whether it succeeded (False if the thread is not running)."""
        with self._lock:
            target = self._rounds + (2 if self._in_round else 1)
            self._wake.set()
            self._round_done.wait_for(lambda: self._rounds >= target, timeout_s)
            return self._rounds >= target and self._round_ok.get(target, False)

    def warm_start(self, key: VariantKey | None, timeout_s: float = 2.0) -> bool:
        """Make `key`'s local pool and fill it from the shared pool (one round, waited for up to
        `timeout_s`); whether that round succeeded. Call when a replica takes on a variant."""
        self.book.pool(key)
        return self.sync_now(timeout_s)

    # ---------------------------------------------------------------------------- reports
    def health(self) -> dict:
        """{"status": "starting"|"ok"|"degraded", "last_sync": epoch|None, "last_error",
        "degraded_since", "store", "pools"} — cheap, for /healthz."""
        with self._lock:
            return {
                "status": self._status,
                "last_sync": self._last_ok,
                "last_error": self._last_error,
                "degraded_since": self._degraded_since,
                "store": self.store.describe(),
                "pools": len(self._states),
            }

    def counters(self) -> dict[str, int]:
        """Totals since start: rounds, pushes, pulls, pushed_ngrams, pulled_ngrams, failures."""
        with self._lock:
            return dict(self._counts)

    # ---------------------------------------------------------------------------- the thread
    def redis_key(self, key: VariantKey | None) -> str | None:
        if key is None:
            return (
                f"{self.settings.namespace}:pool:base:{self.base_model}"
                if self.base_model
                else None
            )
        return f"{self.settings.namespace}:pool:v:{key}"

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                break
            ok = self._round()
            delay = self.settings.interval_s if ok else self._backoff()

    def _backoff(self) -> float:
        s = self.settings
        return min(s.max_backoff_s, s.interval_s * 2 ** min(self._failures_in_row - 1, 16))

    def _round(self) -> bool:
        with self._lock:
            self._in_round = True
        try:
            self._sync_all(full_push=self._resync)
        except Exception as err:  # noqa: BLE001 - any failure: keep local state, retry later
            self._finish(err)
            return False
        self._finish(None)
        return True

    def _finish(self, err: Exception | None) -> None:
        now = time.time()
        with self._lock:
            self._rounds += 1
            self._in_round = False
            self._round_ok[self._rounds] = err is None
            self._round_ok.pop(self._rounds - 64, None)
            self._counts["rounds"] += 1
            if err is None:
                if self._status == "degraded":
                    log.info("pool sync: store %s is back; resynced", self.store.describe())
                self._status, self._last_ok, self._degraded_since = "ok", now, None
                self._failures_in_row, self._resync = 0, False
            else:
                self._counts["failures"] += 1
                self._failures_in_row += 1
                self._last_error = f"{type(err).__name__}: {err}"
                if self._status != "degraded":
                    log.warning(
                        "pool sync degraded (serving from local pools): %s", self._last_error
                    )
                    self._status, self._degraded_since = "degraded", now
                self._resync = True
            self._round_done.notify_all()

    def _sync_all(self, full_push: bool) -> None:
        if full_push:
            self.store.ping()  # cheap check before snapshotting pools for a resync
        local = self.book.keys()  # a list (PoolBook is not iterable)
        keys = [k for k in local if self.redis_key(k) is not None]
        for gone in set(self._states) - set(keys):
            del self._states[gone]
        for key in keys:
            pool = self.book.peek(key)
            if pool is None:  # dropped by the book meanwhile
                continue
            state = self._states.setdefault(key, _PoolState())
            self._sync_one(self.redis_key(key), pool, state, full_push)

    def _sync_one(self, rkey: str, pool: NGramPool, state: _PoolState, full_push: bool) -> None:
        s = self.settings
        if full_push:  # after an outage: the store may have lost the pool, push our newest
            state.queue((encode(k, c) for k, c in pool.recent(s.max_entries)), s.max_entries)
        state.queue((encode(k, c) for k, c in pool.drain_journal()), s.max_entries)
        pushed = set(state.pending)
        if pushed:
            self.store.pool_push(rkey, list(state.pending), s.max_entries, s.ttl_s)
            state.pending.clear()
            self._count(pushes=1, pushed_ngrams=len(pushed))
        members, since = self.store.pool_pull(rkey, state.since, s.pull_limit)
        state.since = since
        fresh = [e for m in members if m not in pushed and (e := decode(m)) is not None]
        if fresh:
            pool.merge(group(fresh), journal=False)
        if members:
            self._count(pulls=1, pulled_ngrams=len(fresh))

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, by in deltas.items():
                self._counts[name] += by
