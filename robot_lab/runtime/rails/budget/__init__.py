"""Budgets: reserve before each model call, reconcile after (the Ruby gem's ``Budget::Ledger``).

Two ledgers with one interface (:class:`BudgetLedger`), and the Robot's per-call helpers:

* :mod:`.ledger` -- the interface and :class:`Ledger`, in process, guarded by a lock: a
  robot's own ``token_budget`` / ``cost_budget``, exactly the Ruby gem's semantics;
* :mod:`.redis_ledger` -- :class:`RedisLedger`, a Redis hash per scope
  (``Keys.budget(scope)``) changed only by Lua scripts, shared by any number of processes;
* :mod:`.ledger_scripts` -- the Lua scripts of the Redis ledger;
* :mod:`.estimate` -- :func:`estimate_call`: how big a call's reservation is;
* :mod:`.calls` -- :func:`reserve_for_call` (waits while reservations in flight may come
  back), :func:`reconcile`, :func:`release`, :func:`check_budgets`: what the Robot does
  around each model call.
"""

from __future__ import annotations

from robot_lab.runtime.rails.budget.calls import (
    Reservation,
    check_budgets,
    reconcile,
    release,
    reserve_for_call,
    robot_ledger,
    within_reservation,
)
from robot_lab.runtime.rails.budget.estimate import CallEstimate, estimate_call
from robot_lab.runtime.rails.budget.ledger import COST, TOKENS, BudgetLedger, Ledger
from robot_lab.runtime.rails.budget.redis_ledger import BudgetHolder, RedisLedger, release_holder

__all__ = [
    "COST",
    "TOKENS",
    "BudgetHolder",
    "BudgetLedger",
    "CallEstimate",
    "Ledger",
    "RedisLedger",
    "Reservation",
    "check_budgets",
    "estimate_call",
    "reconcile",
    "release",
    "release_holder",
    "reserve_for_call",
    "robot_ledger",
    "within_reservation",
]
