"""The shared ledger: one Redis hash per scope, changed only by Lua scripts.

Robots in any number of processes share one budget ("this network run", "tenant acme
today"). Each script is atomic, so there is no read-modify-write race between processes.
Semantics are the in-process :class:`~.ledger.Ledger`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.rails.budget.ledger import exceeded, parse_amount

# Hash fields per dimension k: "limit:k", "consumed:k", "reserved:k". ARGV[1] is the TTL in
# seconds (0 = none); it is applied only while the key has no TTL yet, so a "per day" scope
# expires a fixed time after its first use, not after its last.

_TTL = """
local function touch(ttl)
  if tonumber(ttl) > 0 and redis.call('TTL', KEYS[1]) == -1 then
    redis.call('EXPIRE', KEYS[1], ttl)
  end
end
local function num(field)
  return tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
end
local function fmt(x) return string.format('%.17g', x) end
"""

# ARGV: ttl, key, amount -> {0} ok | {1, committed+amount, limit} refused | {2} unlimited
_RESERVE = _TTL + """
local limit = redis.call('HGET', KEYS[1], 'limit:' .. ARGV[2])
if not limit then return {2} end
limit = tonumber(limit)
local amount = tonumber(ARGV[3])
local committed = num('consumed:' .. ARGV[2]) + num('reserved:' .. ARGV[2])
if committed + amount > limit then
  return {1, fmt(committed + amount), fmt(limit)}
end
redis.call('HSET', KEYS[1], 'reserved:' .. ARGV[2], fmt(num('reserved:' .. ARGV[2]) + amount))
touch(ARGV[1])
return {0}
"""

# ARGV: ttl, key, cap ('' = none) -> {0, reserved} | {1, committed, limit} nothing left
#                                    | {2} unlimited
_RESERVE_REMAINING = _TTL + """
local limit = redis.call('HGET', KEYS[1], 'limit:' .. ARGV[2])
if not limit then return {2} end
limit = tonumber(limit)
local reserved = num('reserved:' .. ARGV[2])
local committed = num('consumed:' .. ARGV[2]) + reserved
local amount = limit - committed
if amount <= 0 then
  return {1, fmt(committed), fmt(limit)}
end
if ARGV[3] ~= '' and tonumber(ARGV[3]) < amount then amount = tonumber(ARGV[3]) end
redis.call('HSET', KEYS[1], 'reserved:' .. ARGV[2], fmt(reserved + amount))
touch(ARGV[1])
return {0, fmt(amount)}
"""

# ARGV: ttl, key, reserved, actual
_RECONCILE = _TTL + """
local r = num('reserved:' .. ARGV[2]) - tonumber(ARGV[3])
if r < 0 then r = 0 end
redis.call('HSET', KEYS[1], 'reserved:' .. ARGV[2], fmt(r),
           'consumed:' .. ARGV[2], fmt(num('consumed:' .. ARGV[2]) + tonumber(ARGV[4])))
touch(ARGV[1])
return 0
"""

# ARGV: ttl, key, amount
_RELEASE = _TTL + """
local r = num('reserved:' .. ARGV[2]) - tonumber(ARGV[3])
if r < 0 then r = 0 end
redis.call('HSET', KEYS[1], 'reserved:' .. ARGV[2], fmt(r))
touch(ARGV[1])
return 0
"""


def _num(value: Any) -> float:
    return float(value.decode() if isinstance(value, bytes) else value)


class RedisLedger:
    """A ledger shared across processes: one Redis hash per ``scope``.

    ``limits`` given here are written to the hash (a scope's limits are configuration: the
    last writer wins); pass ``limits=None`` to use limits someone else set. ``ttl`` (seconds)
    makes the whole scope expire that long after its first write - use it with a dated
    scope name (``"tenant:acme:2026-11-30"``) for per-tenant daily budgets.
    """

    def __init__(
        self,
        scope: str,
        limits: Mapping[str, float | int | None] | None = None,
        *,
        redis: Any = None,
        keys: Any = None,
        ttl: int | None = None,
    ) -> None:
        from robot_lab.connection import get_redis
        from robot_lab.keys import default_keys

        if not scope or not isinstance(scope, str):
            raise ConfigurationError(f"RedisLedger needs a non-empty scope name, got {scope!r}")
        self.scope = scope
        self.redis = redis if redis is not None else get_redis()
        self.key = (keys or default_keys()).budget(scope)
        self.ttl = int(ttl or 0)
        if self.ttl < 0:
            raise ConfigurationError(f"budget ttl must be >= 0 seconds, got {ttl!r}")
        self._reserve = self.redis.register_script(_RESERVE)
        self._reserve_remaining = self.redis.register_script(_RESERVE_REMAINING)
        self._reconcile = self.redis.register_script(_RECONCILE)
        self._release = self.redis.register_script(_RELEASE)
        if limits:
            self.set_limits(limits)

    def set_limits(self, limits: Mapping[str, float | int | None]) -> None:
        """Write limits; a None value removes that dimension's limit (unlimited)."""
        pipe = self.redis.pipeline(transaction=True)
        for key, value in limits.items():
            if value is None:
                pipe.hdel(self.key, f"limit:{key}")
            else:
                pipe.hset(self.key, f"limit:{key}", repr(parse_amount(value, f"limit for {key!r}")))
        if self.ttl:
            pipe.expire(self.key, self.ttl, nx=True)
        pipe.execute()

    def _all_fields(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {"limit": {}, "consumed": {}, "reserved": {}}
        for field_name, value in self.redis.hgetall(self.key).items():
            name = field_name.decode() if isinstance(field_name, bytes) else field_name
            kind, _, key = name.partition(":")
            if kind in out:
                out[kind][key] = _num(value)
        return out

    def _fields(self, prefix: str) -> dict[str, float]:
        return self._all_fields()[prefix.rstrip(":")]

    def snapshot(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(limits, consumed)`` from one HGETALL."""
        fields = self._all_fields()
        return fields["limit"], fields["consumed"]

    @property
    def limits(self) -> dict[str, float]:
        return self._fields("limit:")

    @property
    def consumed(self) -> dict[str, float]:
        return self._fields("consumed:")

    @property
    def reserved(self) -> dict[str, float]:
        return self._fields("reserved:")

    def reserve(self, key: str, amount: float) -> None:
        amount = parse_amount(amount, "amount")
        result = self._reserve(keys=[self.key], args=[self.ttl, key, repr(amount)])
        if int(result[0]) == 1:
            raise exceeded(self.scope, key, _num(result[1]), _num(result[2]))

    def reserve_remaining(self, key: str, cap: float | None = None) -> float:
        """Atomically reserve everything left (or at most ``cap``); see Ledger."""
        cap_arg = "" if cap is None else repr(parse_amount(cap, "cap"))
        result = self._reserve_remaining(keys=[self.key], args=[self.ttl, key, cap_arg])
        status = int(result[0])
        if status == 2:
            return 0.0
        if status == 1:
            raise exceeded(self.scope, key, _num(result[1]), _num(result[2]), nothing_left=True)
        return _num(result[1])

    def reconcile(self, key: str, reserved: float, actual: float) -> None:
        self._reconcile(
            keys=[self.key],
            args=[self.ttl, key, repr(parse_amount(reserved, "reserved amount")), repr(parse_amount(actual, "actual amount"))],
        )

    def release(self, key: str, amount: float) -> None:
        self._release(keys=[self.key], args=[self.ttl, key, repr(parse_amount(amount, "amount"))])

    def remaining(self, key: str) -> float:
        raw = self.redis.hmget(self.key, [f"limit:{key}", f"consumed:{key}", f"reserved:{key}"])
        if raw[0] is None:
            return math.inf
        limit, consumed, reserved = (_num(v) if v is not None else 0.0 for v in raw)
        return max(limit - consumed - reserved, 0.0)

    def reset(self) -> None:
        """Forget consumption and reservations, keep the limits (a new period)."""
        fields = [f for f in self.redis.hkeys(self.key) if not (f.decode() if isinstance(f, bytes) else f).startswith("limit:")]
        if fields:
            self.redis.hdel(self.key, *fields)

    def __repr__(self) -> str:
        return f"RedisLedger(scope={self.scope!r}, key={self.key!r})"
