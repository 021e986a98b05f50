"""The `Store` on a Redis server (redis-py, short timeouts, one quick retry of broken connections):
the compound steps are Lua scripts, so each is atomic on the server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from specserve.platform.state.store import Store, StoreError, StoreUnavailable

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

# the end of a push: keep the newest ARGV[1] members, expire the set ARGV[2] ms after the push
_TRIM_AND_EXPIRE = """
local cap = tonumber(ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n > cap then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - cap - 1) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return score
"""

# score = max(server clock in ms, highest score + 1): strictly increasing per pool, so a pull
# that saw score s has seen every member of every push up to s.
_POOL_PUSH = (
    """
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
"""
    + _TRIM_AND_EXPIRE
)

# KEYS: the sample set, then the guard maps; ARGV: cap, retention ms, member, the guard fields
_SAMPLE_PUSH = (
    """
for i = 2, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[i + 2]) == 0 then return false end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = now
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) >= score then score = tonumber(top[2]) + 1 end
redis.call('ZADD', KEYS[1], score, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[2])))
"""
    + _TRIM_AND_EXPIRE
)

_SAMPLE_PULL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[1])))
local n = tonumber(ARGV[2])
return redis.call('ZRANGE', KEYS[1], -n, -1)
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
        self._sample_push = self._client.register_script(_SAMPLE_PUSH)
        self._sample_pull = self._client.register_script(_SAMPLE_PULL)

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

    def durable(self) -> bool | None:
        """The server's own answer: an append-only file, or RDB snapshot rules (`save`); None
        when it hides its config (CONFIG disabled, as on some managed Redis) and has no AOF."""
        if int(self._do(self._client.info, "persistence").get("aof_enabled", 0)):
            return True
        try:
            save = self._do(self._client.config_get, "save").get("save", "")
        except StoreUnavailable:
            raise
        except StoreError:
            return None
        return bool(save.strip())

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

    # the parameters' types are Store.add_version's (one line here, not its signature again)
    def add_version(self, counter_key, versions_key, index_key, member, record, bump=None) -> int:
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

    def sample_push(self, key, member, cap, retention_s, guards=()) -> int | None:
        keys = [key, *(k for k, _ in guards)]
        args = [cap, _ms(retention_s), member, *(f for _, f in guards)]
        score = self._do(self._sample_push, keys=keys, args=args)
        return None if score is None else int(score)

    def sample_pull(self, key: str, retention_s: float, limit: int) -> list[str]:
        if limit <= 0:
            return []
        return list(self._do(self._sample_pull, keys=[key], args=[_ms(retention_s), limit]))


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))
