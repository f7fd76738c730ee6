"""The ledger interface and the in-process ledger (the Ruby gem's ``Budget::Ledger``).

A dimension (``"tokens"``, ``"cost"``, any name) with no limit is unlimited.
``reserve(k, amount)`` raises :class:`~robot_lab.errors.BudgetExceeded` when
``consumed + reserved + amount > limit``; ``reconcile(k, reserved, actual)`` drops the
reservation (floored at 0) and adds the actual use; ``release(k, amount)`` drops a
reservation; ``remaining(k)`` is ``max(limit - consumed - reserved, 0)`` or ``inf``.
:class:`Ledger` keeps this in process under a lock: a robot's own ``token_budget`` /
``cost_budget``. The shared one is :class:`~.redis_ledger.RedisLedger`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from robot_lab.errors import BudgetExceeded, ConfigurationError

TOKENS = "tokens"
COST = "cost"


def fmt_amount(value: float) -> str:
    """Ints print as ints (``120 > 100``), other numbers as Python floats."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def exceeded(scope: str | None, key: str, total: float, limit: float, *, nothing_left: bool = False) -> BudgetExceeded:
    """The Ruby gem's message ``budget exceeded for k: X > L``, plus the scope when shared.

    ``nothing_left`` words the case robot_lab cannot reach: everything is committed but
    not yet overrun (``X >= L``), e.g. another process holds the rest of a shared budget.
    """
    if nothing_left and total <= limit:
        message = f"budget exceeded for {key}: {fmt_amount(total)} >= {fmt_amount(limit)} (nothing remaining)"
    else:
        message = f"budget exceeded for {key}: {fmt_amount(total)} > {fmt_amount(limit)}"
    if scope:
        message += f" (scope: {scope})"
    error = BudgetExceeded(message)
    error.scope = scope  # type: ignore[attr-defined]
    error.dimension = key  # type: ignore[attr-defined]
    error.limit = limit  # type: ignore[attr-defined]
    error.requested = total  # type: ignore[attr-defined]
    return error


def parse_amount(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"budget {what} must be a number, got {value!r}") from None
    if math.isnan(number) or number < 0:
        raise ConfigurationError(f"budget {what} must be >= 0, got {value!r}")
    return number


def _limits(limits: Mapping[str, Any] | None) -> dict[str, float]:
    return {str(k): parse_amount(v, f"limit for {k!r}") for k, v in (limits or {}).items() if v is not None}


@runtime_checkable
class BudgetLedger(Protocol):
    """What the Robot needs from a ledger."""

    scope: str | None

    @property
    def limits(self) -> dict[str, float]: ...

    @property
    def consumed(self) -> dict[str, float]: ...

    def reserve(self, key: str, amount: float) -> None: ...

    def reserve_call(self, key: str, amount: float | None) -> float | None: ...

    def reconcile(self, key: str, reserved: float, actual: float) -> None: ...

    def release(self, key: str, amount: float) -> None: ...

    def remaining(self, key: str) -> float: ...

    def snapshot(self) -> tuple[dict[str, float], dict[str, float]]: ...


class Ledger:
    """In-process ledger (the Ruby gem's ``Budget::Ledger``), thread-safe."""

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
        amount = parse_amount(amount, "amount")
        with self._lock:
            limit = self._limits.get(key)
            if limit is None:
                return
            committed = self._consumed.get(key, 0.0) + self._reserved.get(key, 0.0)
            if committed + amount > limit:
                raise exceeded(self.scope, key, committed + amount, limit)
            self._reserved[key] = self._reserved.get(key, 0.0) + amount

    def reserve_call(self, key: str, amount: float | None) -> float | None:
        """One model call's reservation, by the rule of :meth:`RedisLedger.reserve_call
        <robot_lab.runtime.rails.budget.redis_ledger.RedisLedger.reserve_call>`: the estimate
        when it fits; None (wait) when it does not but other calls hold reservations; what is
        free when nothing is in flight; BudgetExceeded when nothing is free. 0.0 if unlimited."""
        wanted = None if amount is None else parse_amount(amount, "amount")
        with self._lock:
            limit = self._limits.get(key)
            if limit is None:
                return 0.0
            reserved = self._reserved.get(key, 0.0)
            committed = self._consumed.get(key, 0.0) + reserved
            free = limit - committed
            if wanted is not None and wanted <= free:
                take = wanted
            elif reserved > 0:
                return None
            elif free > 0:
                take = free
            else:
                raise exceeded(self.scope, key, committed, limit, nothing_left=True)
            self._reserved[key] = reserved + take
            return take

    def reconcile(self, key: str, reserved: float, actual: float) -> None:
        """Replace a reservation with the amount actually used."""
        reserved = parse_amount(reserved, "reserved amount")
        actual = parse_amount(actual, "actual amount")
        with self._lock:
            self._reserved[key] = max(0.0, self._reserved.get(key, 0.0) - reserved)
            self._consumed[key] = self._consumed.get(key, 0.0) + actual

    def release(self, key: str, amount: float) -> None:
        """Drop a reservation without recording use (the call did not happen)."""
        amount = parse_amount(amount, "amount")
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
