"""The Robot's per-call budget helpers: reserve before a model call, reconcile after.

See docs/safety.md for the exact call sequence::

    estimate = estimate_call(model, messages, tools, max_tokens)
    reservation = reserve_for_call(ledgers, estimate)   # waits; BudgetExceeded: refuse
    try:
        response = call_model(...)
    except BaseException:
        release(reservation); raise
    reconcile(reservation, tokens=in_tok + out_tok, cost=cost)
    check_budgets(ledgers)                              # InferenceError after an overrun
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import BudgetExceeded, InferenceError
from robot_lab.logging import get_logger
from robot_lab.runtime.rails.budget.estimate import CallEstimate
from robot_lab.runtime.rails.budget.ledger import COST, TOKENS, BudgetLedger, Ledger, fmt_amount
from robot_lab.settings import get_settings

_log = get_logger("robot_lab.budget")
_FIRST_POLL = 0.02
_MAX_POLL = 0.25


@dataclass
class Reservation:
    """What :func:`reserve_for_call` held: ``(ledger, dimension, amount)`` entries."""

    entries: list[tuple[Any, str, float]] = field(default_factory=list)
    settled: bool = False

    def __bool__(self) -> bool:
        return bool(self.entries)


def reserve_for_call(
    ledgers: Iterable[BudgetLedger | None],
    estimate: CallEstimate,
    *,
    timeout: float | None = None,
) -> Reservation:
    """Before a model call: reserve the call's estimate in every limited dimension of every ledger.

    All or nothing: when any ledger says "wait" (the call does not fit, but other calls hold
    reservations that may come back), what this attempt reserved is given back and the whole
    reservation is tried again after a short jittered pause, until ``timeout`` seconds
    (setting ``budget.wait_timeout``) have passed; then BudgetExceeded. Giving back before
    waiting means two calls can never hold one ledger each while waiting for the other's.
    A ledger with nothing free and nothing in flight refuses at once (BudgetExceeded).
    """
    if timeout is None:
        timeout = get_settings().budget.wait_timeout
    active = [ledger for ledger in ledgers if ledger is not None]
    deadline = time.monotonic() + timeout
    pause = _FIRST_POLL
    waited_for: tuple[Any, str] | None = None
    started = time.monotonic()
    while True:
        reservation = Reservation()
        blocked: tuple[Any, str] | None = None
        try:
            for ledger in active:
                for key in sorted(ledger.limits):
                    amount = ledger.reserve_call(key, estimate.amount(key))
                    if amount is None:
                        blocked = (ledger, key)
                        break
                    reservation.entries.append((ledger, key, amount))
                if blocked is not None:
                    break
        except BaseException:
            release(reservation)
            raise
        if blocked is None:
            if waited_for is not None:
                _log.info("budget.wait_ended", scope=waited_for[0].scope, key=waited_for[1],
                          waited=round(time.monotonic() - started, 3))
            return reservation
        release(reservation)
        left = deadline - time.monotonic()
        ledger, key = blocked
        if left <= 0:
            raise _wait_timed_out(ledger, key, estimate.amount(key), timeout)
        if waited_for is None:
            _log.info("budget.waiting", scope=ledger.scope, key=key, wanted=estimate.amount(key), timeout=timeout)
        waited_for = blocked
        time.sleep(min(left, pause * random.uniform(0.5, 1.5)))
        pause = min(pause * 2, _MAX_POLL)


def _wait_timed_out(ledger: Any, key: str, wanted: float | None, timeout: float) -> BudgetExceeded:
    size = "all that is free" if wanted is None else fmt_amount(float(wanted))
    message = (f"budget exceeded for {key}: a call needing {size} did not fit within {timeout:g} s "
               f"while other calls held reservations")
    if ledger.scope:
        message += f" (scope: {ledger.scope})"
    error = BudgetExceeded(message)
    error.scope = ledger.scope  # type: ignore[attr-defined]
    error.dimension = key  # type: ignore[attr-defined]
    error.limit = ledger.limits.get(key)  # type: ignore[attr-defined]
    error.requested = wanted  # type: ignore[attr-defined]
    return error


def reconcile(reservation: Reservation, tokens: float, cost: float | None = None) -> None:
    """After a model call: turn the reservation into actual use (tokens = input + output;
    cost in dollars, 0.0 when unknown). Idempotent: a second call does nothing."""
    if reservation.settled:
        return
    reservation.settled = True
    actual = {TOKENS: float(tokens or 0), COST: float(cost or 0.0)}
    for ledger, key, amount in reservation.entries:
        ledger.reconcile(key, amount, actual.get(key, 0.0))


def within_reservation(reservation: Reservation, tokens: float | None, cost: float | None) -> bool:
    """Whether a call used no more than it reserved in every dimension. Such a call keeps its
    answer whatever the ledger shows after it: only a call that used more than it was
    granted can be the one that ran a budget over (calls refused before they start are the
    rest of the protection)."""
    actual = {TOKENS: float(tokens or 0), COST: float(cost or 0.0)}
    return all(actual.get(key, 0.0) <= amount for _, key, amount in reservation.entries)


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
    """The Ruby gem's InferenceError for an overrun, marked not retryable: another attempt
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

    Messages are the Ruby gem's: ``"Token budget exceeded: N tokens used, budget is B"`` and
    ``"Cost budget exceeded: $%.6f used, budget is $%.6f"``; a shared (scoped) ledger adds
    ``" (scope: name)"``. ``tokens_used``/``token_budget`` let the Robot check its running
    token totals exactly as robot_lab does (``total_input + total_output > token_budget``).
    """
    if token_budget is not None and tokens_used is not None and tokens_used > token_budget:
        raise _overrun(f"Token budget exceeded: {fmt_amount(float(tokens_used))} tokens used, budget is {fmt_amount(float(token_budget))}")
    for ledger in ledgers:
        if ledger is None:
            continue
        limits, consumed = ledger.snapshot()
        suffix = f" (scope: {ledger.scope})" if ledger.scope else ""
        if TOKENS in limits and consumed.get(TOKENS, 0.0) > limits[TOKENS]:
            raise _overrun(
                f"Token budget exceeded: {fmt_amount(consumed[TOKENS])} tokens used, budget is {fmt_amount(limits[TOKENS])}{suffix}"
            )
        if COST in limits and consumed.get(COST, 0.0) > limits[COST]:
            raise _overrun(
                f"Cost budget exceeded: ${consumed[COST]:.6f} used, budget is ${limits[COST]:.6f}{suffix}"
            )


def robot_ledger(token_budget: float | None = None, cost_budget: float | None = None) -> Ledger | None:
    """The robot's own ledger from its RunConfig (None when neither budget is set)."""
    limits = {k: v for k, v in ((TOKENS, token_budget), (COST, cost_budget)) if v is not None}
    return Ledger(limits=limits) if limits else None
