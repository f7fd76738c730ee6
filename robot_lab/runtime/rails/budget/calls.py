"""The Robot's per-call budget helpers: reserve before a model call, reconcile after.

See docs/safety.md for the exact call sequence::

    reservation = reserve_all_remaining(ledgers)        # BudgetExceeded: refuse the call
    try:
        response = call_model(...)
    except BaseException:
        release(reservation); raise
    reconcile(reservation, tokens=in_tok + out_tok, cost=cost)
    check_budgets(ledgers)                              # InferenceError after an overrun
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import InferenceError
from robot_lab.logging import get_logger
from robot_lab.runtime.rails.budget.ledger import COST, TOKENS, BudgetLedger, Ledger, fmt_amount

_log = get_logger("robot_lab.budget")



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
        raise InferenceError(f"Token budget exceeded: {fmt_amount(float(tokens_used))} tokens used, budget is {fmt_amount(float(token_budget))}")
    for ledger in ledgers:
        if ledger is None:
            continue
        limits, consumed = ledger.snapshot()
        suffix = f" (scope: {ledger.scope})" if ledger.scope else ""
        if TOKENS in limits and consumed.get(TOKENS, 0.0) > limits[TOKENS]:
            raise InferenceError(
                f"Token budget exceeded: {fmt_amount(consumed[TOKENS])} tokens used, budget is {fmt_amount(limits[TOKENS])}{suffix}"
            )
        if COST in limits and consumed.get(COST, 0.0) > limits[COST]:
            raise InferenceError(
                f"Cost budget exceeded: ${consumed[COST]:.6f} used, budget is ${limits[COST]:.6f}{suffix}"
            )


def robot_ledger(token_budget: float | None = None, cost_budget: float | None = None) -> Ledger | None:
    """The robot's own ledger from its RunConfig (None when neither budget is set)."""
    limits = {k: v for k, v in ((TOKENS, token_budget), (COST, cost_budget)) if v is not None}
    return Ledger(limits=limits) if limits else None
