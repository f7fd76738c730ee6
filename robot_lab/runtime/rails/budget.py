"""Budgets: reserve before each model call, reconcile after (robot_lab's ``Budget::Ledger``).

Two ledgers with one interface (:class:`BudgetLedger`):

* :class:`Ledger` - in process, guarded by a lock: a robot's own ``token_budget`` /
  ``cost_budget``, exactly robot_lab's semantics.
* :class:`RedisLedger` - a Redis hash per scope (``Keys.budget(scope)``) changed only by Lua
  scripts, so robots in any number of processes share one budget ("this network run",
  "tenant acme today"). Each script is atomic; there is no read-modify-write race.

Semantics (both): a dimension (``"tokens"``, ``"cost"``, any name) with no limit is
unlimited. ``reserve(k, amount)`` raises :class:`~robot_lab.errors.BudgetExceeded` when
``consumed + reserved + amount > limit``; ``reconcile(k, reserved, actual)`` drops the
reservation (floored at 0) and adds the actual use; ``release(k, amount)`` drops a
reservation; ``remaining(k)`` is ``max(limit - consumed - reserved, 0)`` or ``inf``.

The Robot's per-call helpers (see docs/safety.md for the exact call sequence)::

    reservation = reserve_all_remaining(ledgers)        # BudgetExceeded: refuse the call
    try:
        response = call_model(...)
    except BaseException:
        release(reservation); raise
    reconcile(reservation, tokens=in_tok + out_tok, cost=cost)
    check_budgets(ledgers)                              # InferenceError after an overrun
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from robot_lab.errors import BudgetExceeded, ConfigurationError, InferenceError
from robot_lab.logging import get_logger

TOKENS = "tokens"
COST = "cost"

_log = get_logger("robot_lab.budget")


def _fmt(value: float) -> str:
    """Ints print as ints (``120 > 100``), other numbers as Python floats."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _exceeded(scope: str | None, key: str, total: float, limit: float, *, nothing_left: bool = False) -> BudgetExceeded:
    """robot_lab's message ``budget exceeded for k: X > L``, plus the scope when shared.

    ``nothing_left`` words the case robot_lab cannot reach: everything is committed but
    not yet overrun (``X >= L``), e.g. another process holds the rest of a shared budget.
    """
    if nothing_left and total <= limit:
        message = f"budget exceeded for {key}: {_fmt(total)} >= {_fmt(limit)} (nothing remaining)"
    else:
        message = f"budget exceeded for {key}: {_fmt(total)} > {_fmt(limit)}"
    if scope:
        message += f" (scope: {scope})"
    error = BudgetExceeded(message)
    error.scope = scope  # type: ignore[attr-defined]
    error.dimension = key  # type: ignore[attr-defined]
    error.limit = limit  # type: ignore[attr-defined]
    error.requested = total  # type: ignore[attr-defined]
    return error


def _amount(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"budget {what} must be a number, got {value!r}") from None
    if math.isnan(number) or number < 0:
        raise ConfigurationError(f"budget {what} must be >= 0, got {value!r}")
    return number


def _limits(limits: Mapping[str, Any] | None) -> dict[str, float]:
    return {str(k): _amount(v, f"limit for {k!r}") for k, v in (limits or {}).items() if v is not None}


@runtime_checkable
class BudgetLedger(Protocol):
    """What the Robot needs from a ledger."""

    scope: str | None

    @property
    def limits(self) -> dict[str, float]: ...

    @property
    def consumed(self) -> dict[str, float]: ...

    def reserve(self, key: str, amount: float) -> None: ...

    def reserve_remaining(self, key: str, cap: float | None = None) -> float: ...

    def reconcile(self, key: str, reserved: float, actual: float) -> None: ...

    def release(self, key: str, amount: float) -> None: ...

    def remaining(self, key: str) -> float: ...

    def snapshot(self) -> tuple[dict[str, float], dict[str, float]]: ...


class Ledger:
    """In-process ledger (robot_lab's ``Budget::Ledger``), thread-safe."""

    def __init__(
        self,
        limits: Mapping[str, float | int | None] | None = None,
        consumed: Mapping[str, float | int] | None = None,
        *,
        scope: str | None = None,
    ) -> None:
        self.scope = scope
        self._lock = threading.Lock()
        self._limits = _limits(limits)
        self._consumed: dict[str, float] = {str(k): float(v) for k, v in (consumed or {}).items()}
        self._reserved: dict[str, float] = {}

    @property
    def limits(self) -> dict[str, float]:
        return dict(self._limits)

    @property
    def consumed(self) -> dict[str, float]:
        with self._lock:
            return dict(self._consumed)

    @property
    def reserved(self) -> dict[str, float]:
        with self._lock:
            return dict(self._reserved)

    def snapshot(self) -> tuple[dict[str, float], dict[str, float]]:
        """``(limits, consumed)`` read together."""
        with self._lock:
            return dict(self._limits), dict(self._consumed)

    def reserve(self, key: str, amount: float) -> None:
        """Reserve ``amount``; BudgetExceeded when it would pass the limit. No-op if unlimited."""
        amount = _amount(amount, "amount")
        with self._lock:
            limit = self._limits.get(key)
            if limit is None:
                return
            committed = self._consumed.get(key, 0.0) + self._reserved.get(key, 0.0)
            if committed + amount > limit:
                raise _exceeded(self.scope, key, committed + amount, limit)
            self._reserved[key] = self._reserved.get(key, 0.0) + amount

    def reserve_remaining(self, key: str, cap: float | None = None) -> float:
        """Reserve everything left, or at most ``cap``; 0.0 if unlimited (nothing to hold).

        A budget with nothing left refuses (BudgetExceeded): the call could only overspend.
        Returns the amount reserved.
        """
        cap_amount = None if cap is None else _amount(cap, "cap")
        with self._lock:
            limit = self._limits.get(key)
            if limit is None:
                return 0.0
            committed = self._consumed.get(key, 0.0) + self._reserved.get(key, 0.0)
            remaining = limit - committed
            if remaining <= 0:
                raise _exceeded(self.scope, key, committed, limit, nothing_left=True)
            amount = remaining if cap_amount is None else min(remaining, cap_amount)
            self._reserved[key] = self._reserved.get(key, 0.0) + amount
            return amount

    def reconcile(self, key: str, reserved: float, actual: float) -> None:
        """Replace a reservation with the amount actually used."""
        reserved = _amount(reserved, "reserved amount")
        actual = _amount(actual, "actual amount")
        with self._lock:
            self._reserved[key] = max(0.0, self._reserved.get(key, 0.0) - reserved)
            self._consumed[key] = self._consumed.get(key, 0.0) + actual

    def release(self, key: str, amount: float) -> None:
        """Drop a reservation without recording use (the call did not happen)."""
        amount = _amount(amount, "amount")
        with self._lock:
            self._reserved[key] = max(0.0, self._reserved.get(key, 0.0) - amount)

    def remaining(self, key: str) -> float:
        with self._lock:
            limit = self._limits.get(key)
            if limit is None:
                return math.inf
            return max(limit - self._consumed.get(key, 0.0) - self._reserved.get(key, 0.0), 0.0)

    def __repr__(self) -> str:
        return f"Ledger(scope={self.scope!r}, limits={self._limits!r}, consumed={self._consumed!r})"


# --- Redis ---------------------------------------------------------------------------------
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
                pipe.hset(self.key, f"limit:{key}", repr(_amount(value, f"limit for {key!r}")))
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
        amount = _amount(amount, "amount")
        result = self._reserve(keys=[self.key], args=[self.ttl, key, repr(amount)])
        if int(result[0]) == 1:
            raise _exceeded(self.scope, key, _num(result[1]), _num(result[2]))

    def reserve_remaining(self, key: str, cap: float | None = None) -> float:
        """Atomically reserve everything left (or at most ``cap``); see Ledger."""
        cap_arg = "" if cap is None else repr(_amount(cap, "cap"))
        result = self._reserve_remaining(keys=[self.key], args=[self.ttl, key, cap_arg])
        status = int(result[0])
        if status == 2:
            return 0.0
        if status == 1:
            raise _exceeded(self.scope, key, _num(result[1]), _num(result[2]), nothing_left=True)
        return _num(result[1])

    def reconcile(self, key: str, reserved: float, actual: float) -> None:
        self._reconcile(
            keys=[self.key],
            args=[self.ttl, key, repr(_amount(reserved, "reserved amount")), repr(_amount(actual, "actual amount"))],
        )

    def release(self, key: str, amount: float) -> None:
        self._release(keys=[self.key], args=[self.ttl, key, repr(_amount(amount, "amount"))])

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


# --- the Robot's per-call helpers -----------------------------------------------------------


@dataclass
class Reservation:
    """What :func:`reserve_all_remaining` held: ``(ledger, dimension, amount)`` entries."""

    entries: list[tuple[Any, str, float]] = field(default_factory=list)
    settled: bool = False

    def __bool__(self) -> bool:
        return bool(self.entries)


def reserve_all_remaining(
    ledgers: Iterable[BudgetLedger | None],
    *,
    caps: Mapping[str, float] | None = None,
) -> Reservation:
    """Before a model call: reserve what is left of every limited dimension of every ledger.

    Raises BudgetExceeded (naming the scope) when any dimension has nothing left; what was
    already reserved in other ledgers is released first, so a refused call holds nothing.
    ``caps`` (e.g. ``{"tokens": max_tokens}``) reserves at most that much per dimension
    instead of everything, so parallel robots sharing one budget do not lock each other out.
    """
    reservation = Reservation()
    try:
        for ledger in ledgers:
            if ledger is None:
                continue
            for key in sorted(ledger.limits):
                amount = ledger.reserve_remaining(key, (caps or {}).get(key))
                reservation.entries.append((ledger, key, amount))
    except BaseException:
        release(reservation)
        raise
    return reservation


def reconcile(reservation: Reservation, tokens: float, cost: float | None = None) -> None:
    """After a model call: turn the reservation into actual use (tokens = input + output;
    cost in dollars, 0.0 when unknown). Idempotent: a second call does nothing."""
    if reservation.settled:
        return
    reservation.settled = True
    actual = {TOKENS: float(tokens or 0), COST: float(cost or 0.0)}
    for ledger, key, amount in reservation.entries:
        ledger.reconcile(key, amount, actual.get(key, 0.0))


def release(reservation: Reservation) -> None:
    """The call did not happen (or raised before any usage was known): drop the holds."""
    if reservation.settled:
        return
    reservation.settled = True
    for ledger, key, amount in reservation.entries:
        try:
            ledger.release(key, amount)
        except Exception as error:  # a failed release must not hide the original error
            _log.warning("budget.release_failed", scope=getattr(ledger, "scope", None), key=key, error=str(error))


def _overrun(message: str) -> InferenceError:
    """robot_lab's InferenceError for an overrun, marked not retryable: another attempt
    (an rq retry of the task) would only spend more."""
    error = InferenceError(message)
    error.retryable = False  # type: ignore[attr-defined]
    return error


def check_budgets(
    ledgers: Sequence[BudgetLedger | None],
    *,
    tokens_used: float | None = None,
    token_budget: float | None = None,
) -> None:
    """After reconciling: InferenceError when this call pushed a ledger over its limit.

    Messages are robot_lab's: ``"Token budget exceeded: N tokens used, budget is B"`` and
    ``"Cost budget exceeded: $%.6f used, budget is $%.6f"``; a shared (scoped) ledger adds
    ``" (scope: name)"``. ``tokens_used``/``token_budget`` let the Robot check its running
    token totals exactly as robot_lab does (``total_input + total_output > token_budget``).
    """
    if token_budget is not None and tokens_used is not None and tokens_used > token_budget:
        raise _overrun(f"Token budget exceeded: {_fmt(float(tokens_used))} tokens used, budget is {_fmt(float(token_budget))}")
    for ledger in ledgers:
        if ledger is None:
            continue
        limits, consumed = ledger.snapshot()
        suffix = f" (scope: {ledger.scope})" if ledger.scope else ""
        if TOKENS in limits and consumed.get(TOKENS, 0.0) > limits[TOKENS]:
            raise _overrun(
                f"Token budget exceeded: {_fmt(consumed[TOKENS])} tokens used, budget is {_fmt(limits[TOKENS])}{suffix}"
            )
        if COST in limits and consumed.get(COST, 0.0) > limits[COST]:
            raise _overrun(
                f"Cost budget exceeded: ${consumed[COST]:.6f} used, budget is ${limits[COST]:.6f}{suffix}"
            )


def robot_ledger(token_budget: float | None = None, cost_budget: float | None = None) -> Ledger | None:
    """The robot's own ledger from its RunConfig (None when neither budget is set)."""
    limits = {k: v for k, v in ((TOKENS, token_budget), (COST, cost_budget)) if v is not None}
    return Ledger(limits=limits) if limits else None


__all__ = [
    "COST",
    "TOKENS",
    "BudgetLedger",
    "Ledger",
    "RedisLedger",
    "Reservation",
    "check_budgets",
    "reconcile",
    "release",
    "reserve_all_remaining",
    "robot_ledger",
]
