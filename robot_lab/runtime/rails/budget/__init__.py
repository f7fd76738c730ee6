"""Budgets: reserve before each model call, reconcile after (robot_lab's ``Budget::Ledger``).

Two ledgers with one interface (:class:`BudgetLedger`), and the Robot's per-call helpers:

* :mod:`.ledger` -- the interface and :class:`Ledger`, in process, guarded by a lock: a
  robot's own ``token_budget`` / ``cost_budget``, exactly robot_lab's semantics;
* :mod:`.redis_ledger` -- :class:`RedisLedger`, a Redis hash per scope
  (``Keys.budget(scope)``) changed only by Lua scripts, shared by any number of processes;
* :mod:`.calls` -- :func:`reserve_all_remaining`, :func:`reconcile`, :func:`release`,
  :func:`check_budgets`: what the Robot does around each model call.
"""

from __future__ import annotations

from robot_lab.runtime.rails.budget.calls import (
    Reservation,
    check_budgets,
    reconcile,
    release,
    reserve_all_remaining,
    robot_ledger,
)
from robot_lab.runtime.rails.budget.ledger import COST, TOKENS, BudgetLedger, Ledger
from robot_lab.runtime.rails.budget.redis_ledger import RedisLedger

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
