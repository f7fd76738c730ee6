"""The shared ledger: one Redis hash per scope, changed only by Lua scripts (:mod:`.ledger_scripts`).

Robots in any number of processes share one budget ("this network run", "tenant acme
today"). Each script is atomic, so there is no read-modify-write race between processes.
Semantics are the in-process :class:`~.ledger.Ledger`'s.

A ledger built with a :class:`BudgetHolder` ties its reservations to a lease: they are
recorded under the holder's id, and the holder's *registry* (a Redis set) names every budget
it holds in. When the lease is gone (the worker died), :func:`release_holder` gives all of
it back -- the network sweeper does that before it re-runs the task.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.keys import default_keys
from robot_lab.runtime.rails.budget import ledger_scripts as scripts
from robot_lab.runtime.rails.budget.ledger import exceeded, parse_amount


@dataclass(frozen=True)
class BudgetHolder:
    """Who holds a reservation, for as long as a lease lives.

    ``id`` is unique to one attempt of one piece of work (a network task's job id and
    worker). ``registry`` is a Redis set with one member per budget this holder reserved in
    (the budget's key and the holder id, joined by a newline), written before the first
    reservation, so whoever sees the lease expire can find and release everything
    (:func:`release_holder`).
    """

    id: str
    registry: str
    ttl: int = 7 * 86_400


def release_holder(redis: Any, registry: str) -> dict[str, dict[str, float]]:
    """Give back everything the holders listed in ``registry`` still hold; delete the registry.

    Returns ``{budget key: {dimension: amount released}}`` (empty dicts left out). Safe to
    call twice and on a holder that settled everything: it then releases nothing.
    """
    members = redis.smembers(registry)
    released: dict[str, dict[str, float]] = {}
    if members:
        script = redis.register_script(scripts.RELEASE_HOLDER)
        for raw in members:
            text = raw.decode() if isinstance(raw, bytes) else raw
            budget_key, _, holder = text.partition("\n")
            out = script(keys=[budget_key], args=[holder])
            amounts = {_text(out[i]): _num(out[i + 1]) for i in range(0, len(out), 2)}
            if amounts:
                released[budget_key] = amounts
    redis.delete(registry)
    return released


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        holder: BudgetHolder | None = None,
    ) -> None:
        from robot_lab.connection import get_redis  # lazy: start-up time

        if not scope or not isinstance(scope, str):
            raise ConfigurationError(f"RedisLedger needs a non-empty scope name, got {scope!r}")
        self.scope = scope
        self.redis = redis if redis is not None else get_redis()
        self.key = (keys or default_keys()).budget(scope)
        self.ttl = int(ttl or 0)
        if self.ttl < 0:
            raise ConfigurationError(f"budget ttl must be >= 0 seconds, got {ttl!r}")
        self.holder = holder
        self._holder_id = holder.id if holder is not None else ""
        self._registered = holder is None
        self._reserve = self.redis.register_script(scripts.RESERVE)
        self._reserve_call = self.redis.register_script(scripts.RESERVE_CALL)
        self._reconcile = self.redis.register_script(scripts.RECONCILE)
        self._release = self.redis.register_script(scripts.RELEASE)
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

    def _register(self) -> None:
        """List this budget in the holder's registry before reserving (a crash in between
        leaves a harmless entry; the other order could leave a hold nobody can find)."""
        if self._registered or self.holder is None:
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(self.holder.registry, f"{self.key}\n{self.holder.id}")
        pipe.expire(self.holder.registry, self.holder.ttl)
        pipe.execute()
        self._registered = True

    def reserve(self, key: str, amount: float) -> None:
        amount = parse_amount(amount, "amount")
        self._register()
        result = self._reserve(keys=[self.key], args=[self.ttl, key, repr(amount), self._holder_id])
        if int(result[0]) == 1:
            raise exceeded(self.scope, key, _num(result[1]), _num(result[2]))

    def reserve_call(self, key: str, amount: float | None) -> float | None:
        """One model call's reservation: ``amount`` (its estimate; None = all that is free).

        Returns what was reserved, 0.0 when the dimension is unlimited, or None when the
        call must **wait**: it does not fit now, but other calls hold reservations that may
        come back. When nothing is in flight a call that does not fit takes what is free
        (the last call may overspend by at most its own size); with nothing free it raises
        BudgetExceeded ("nothing remaining").
        """
        amount_arg = "" if amount is None else repr(parse_amount(amount, "amount"))
        self._register()
        result = self._reserve_call(keys=[self.key], args=[self.ttl, key, amount_arg, self._holder_id])
        status = int(result[0])
        if status == 2:
            return 0.0
        if status == 3:
            return None
        if status == 1:
            raise exceeded(self.scope, key, _num(result[1]), _num(result[2]), nothing_left=True)
        return _num(result[1])

    def reconcile(self, key: str, reserved: float, actual: float) -> None:
        self._reconcile(
            keys=[self.key],
            args=[self.ttl, key, repr(parse_amount(reserved, "reserved amount")),
                  repr(parse_amount(actual, "actual amount")), self._holder_id],
        )

    def release(self, key: str, amount: float) -> None:
        self._release(keys=[self.key], args=[self.ttl, key, repr(parse_amount(amount, "amount")), self._holder_id])

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
