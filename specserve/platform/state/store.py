"""The state store behind the registry and the shared n-gram pools: one interface (`Store`), two
implementations — `RedisStore` (redis-py, short timeouts) and `MemoryStore` (in-process, thread-safe,
also servable from a Ray actor through `CallStore`). Every method is atomic on its own.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry


class StoreError(RuntimeError):
    """A store operation failed."""


class StoreUnavailable(StoreError):
    """The store could not be reached (connection refused, timeout, authentication)."""


class Store(ABC):
    """What the registry and pool sync need. Keys and fields are strings; values are strings.

    Documents: get/set/delete. Maps: hget/hset/hgetall/hdel/hincr, and in one round trip each
    hkeys/hgetall_many (listing many variants must not cost a round trip per variant). Counters: incr.
    Compound atomic steps: `add_version`, `remove`. Pools (sorted by recency, bounded, expiring):
    `pool_push`, `pool_pull`. Failures to reach the store raise `StoreUnavailable`.
    """

    kind: str = "store"

    @abstractmethod
    def ping(self) -> None: ...

    @abstractmethod
    def describe(self) -> str:
        """Where the store is, for logs (never a password)."""

    def close(self) -> None:
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


# --------------------------------------------------------------------------------------- memory


class _Pool(dict):
    """member -> score, in score order (scores only grow, a refreshed member moves to the end)."""


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

    def add_version(
        self,
        counter_key: str,
        versions_key: str,
        index_key: str,
        member: str,
        record: str,
        bump: str | None = None,
    ) -> int:
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


class CallStore(Store):
    """A `Store` whose every call goes through `call(method_name, *args)`: e.g. to a `MemoryStore`
    inside a Ray actor (`call = lambda m, *a: ray.get(getattr(actor, m).remote(*a), timeout=2)`),
    the in-cluster store when no Redis exists. Errors of `call` become `StoreUnavailable`."""

    kind = "memory"

    def __init__(self, call: Callable[..., object], where: str = "store actor") -> None:
        self._call = call
        self._where = where

    def describe(self) -> str:
        return self._where

    def _do(self, method: str, *args):
        try:
            return self._call(method, *args)
        except StoreError:
            raise
        except Exception as err:  # transport errors: actor gone, timeout
            raise StoreUnavailable(f"{self._where}: {type(err).__name__}: {err}") from err

    def ping(self) -> None:
        self._do("ping")

    def get(self, key):
        return self._do("get", key)

    def set(self, key, value):
        self._do("set", key, value)

    def delete(self, *keys):
        return self._do("delete", *keys)

    def incr(self, key, by=1):
        return self._do("incr", key, by)

    def hget(self, key, field):
        return self._do("hget", key, field)

    def hset(self, key, mapping):
        self._do("hset", key, dict(mapping))

    def hgetall(self, key):
        return self._do("hgetall", key)

    def hkeys(self, key):
        return list(self._do("hkeys", key))

    def hgetall_many(self, keys):
        return list(self._do("hgetall_many", list(keys)))

    def hdel(self, key, *fields):
        return self._do("hdel", key, *fields)

    def hincr(self, key, increments):
        return self._do("hincr", key, dict(increments))

    def add_version(self, counter_key, versions_key, index_key, member, record, bump=None):
        args = (counter_key, versions_key, index_key, member, record)
        return self._do("add_version", *args, *([bump] if bump is not None else []))

    def remove(self, fields, keys, bump=None):
        args = ([tuple(f) for f in fields], list(keys))
        return self._do("remove", *args, *([bump] if bump is not None else []))

    def pool_push(self, key, members, cap, ttl_s):
        return self._do("pool_push", key, list(members), cap, ttl_s)

    def pool_pull(self, key, since, limit):
        members, score = self._do("pool_pull", key, since, limit)
        return list(members), score


# ---------------------------------------------------------------------------------------- redis

# counters first: a wrong-typed key fails the script before it writes anything
_ADD_VERSION = """
if KEYS[4] then redis.call('INCR', KEYS[4]) end
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], v, ARGV[1])
redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[1])
return v
"""

# ARGV: number of fields, whether the last key is a counter to bump, then the field names
_REMOVE = """
local n, last = tonumber(ARGV[1]), #KEYS
if ARGV[2] == '1' then
  redis.call('INCR', KEYS[last])
  last = last - 1
end
local existed = {}
for i = 1, n do
  existed[i] = redis.call('HDEL', KEYS[i], ARGV[i + 2])
end
for i = n + 1, last do
  redis.call('DEL', KEYS[i])
end
return existed
"""

_HINCR = """
local out = {}
for i = 1, #ARGV, 2 do
  out[#out + 1] = redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return out
"""

# score = max(server clock in ms, highest score + 1): strictly increasing per pool, so a pull
# that saw score s has seen every member of every push up to s.
_POOL_PUSH = """
local t = redis.call('TIME')
local score = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) >= score then score = tonumber(top[2]) + 1 end
for i = 3, #ARGV, 500 do
  local args = {}
  for j = i, math.min(i + 499, #ARGV) do
    args[#args + 1] = score
    args[#args + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[1], unpack(args))
end
local cap = tonumber(ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n > cap then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - cap - 1) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return score
"""


def mask_url(url: str) -> str:
    """`redis://:secret@host:6379/1` -> `redis://:***@host:6379/1`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RedisStore(Store):
    """The interface on a Redis server given by URL (`redis://[:password@]host:port/db`,
    `rediss://` for TLS). Short socket timeouts and one quick retry: callers fail fast."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        socket_timeout_s: float = 1.0,
        connect_timeout_s: float = 0.5,
        retries: int = 1,
        client_name: str = "specserve",
    ) -> None:
        self.url = url
        self._client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            # Retry only broken connections (e.g. after a Redis restart), never timeouts: a
            # timed-out script may have run, and registrations must not be applied twice.
            retry=Retry(
                ExponentialBackoff(cap=0.1, base=0.01),
                retries,
                supported_errors=(redis.ConnectionError,),
            ),
            health_check_interval=30,
            client_name=client_name,
        )
        self._add_version = self._client.register_script(_ADD_VERSION)
        self._remove = self._client.register_script(_REMOVE)
        self._hincr = self._client.register_script(_HINCR)
        self._pool_push = self._client.register_script(_POOL_PUSH)

    def describe(self) -> str:
        return mask_url(self.url)

    def _do(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, redis.AuthenticationError) as err:
            raise StoreUnavailable(f"{self.describe()}: {type(err).__name__}: {err}") from err
        except redis.ResponseError as err:
            if "NOAUTH" in str(err) or "WRONGPASS" in str(err):
                raise StoreUnavailable(f"{self.describe()}: {err}") from err
            raise StoreError(f"{self.describe()}: {err}") from err

    def close(self) -> None:
        self._client.close()

    def ping(self) -> None:
        self._do(self._client.ping)

    def get(self, key: str) -> str | None:
        return self._do(self._client.get, key)

    def set(self, key: str, value: str) -> None:
        self._do(self._client.set, key, value)

    def delete(self, *keys: str) -> int:
        return int(self._do(self._client.delete, *keys)) if keys else 0

    def incr(self, key: str, by: int = 1) -> int:
        return int(self._do(self._client.incrby, key, by))

    def hget(self, key: str, field: str) -> str | None:
        return self._do(self._client.hget, key, field)

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            self._do(self._client.hset, key, mapping={k: str(v) for k, v in mapping.items()})

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self._do(self._client.hgetall, key))

    def hkeys(self, key: str) -> list[str]:
        return list(self._do(self._client.hkeys, key))

    def hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]:
        if not keys:
            return []

        def read() -> list:
            pipe = self._client.pipeline(transaction=True)  # MULTI/EXEC: one snapshot, one trip
            for key in keys:
                pipe.hgetall(key)
            return pipe.execute()

        return [dict(found) for found in self._do(read)]

    def hdel(self, key: str, *fields: str) -> int:
        return int(self._do(self._client.hdel, key, *fields)) if fields else 0

    def hincr(self, key: str, increments: Mapping[str, int]) -> dict[str, int]:
        items = list(increments.items())
        args = [x for field, by in items for x in (field, int(by))]
        values = self._do(self._hincr, keys=[key], args=args)
        return {field: int(v) for (field, _), v in zip(items, values, strict=True)}

    def add_version(
        self,
        counter_key: str,
        versions_key: str,
        index_key: str,
        member: str,
        record: str,
        bump: str | None = None,
    ) -> int:
        keys = [counter_key, versions_key, index_key] + ([bump] if bump is not None else [])
        return int(self._do(self._add_version, keys=keys, args=[record, member]))

    def remove(
        self, fields: Sequence[tuple[str, str]], keys: Sequence[str], bump: str | None = None
    ) -> list[bool]:
        script_keys = [k for k, _ in fields] + list(keys) + ([bump] if bump is not None else [])
        args = [len(fields), int(bump is not None)] + [f for _, f in fields]
        existed = self._do(self._remove, keys=script_keys, args=args)
        return [bool(x) for x in existed]

    def pool_push(self, key: str, members: Sequence[str], cap: int, ttl_s: float) -> int:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        return int(self._do(self._pool_push, keys=[key], args=[cap, ttl_ms, *members]))

    def pool_pull(self, key: str, since: int, limit: int) -> tuple[list[str], int]:
        if limit <= 0:
            return [], since
        rows = self._do(
            self._client.zrange,
            key,
            "+inf",
            f"({since}",
            desc=True,
            byscore=True,
            offset=0,
            num=limit,
            withscores=True,
        )
        rows = list(reversed(rows))
        return [m for m, _ in rows], max((int(s) for _, s in rows), default=since)
