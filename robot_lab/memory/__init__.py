"""Shared Memory: a Redis hash per scope with a version counter, a change stream and
pub/sub, so blocking reads and subscriptions work across processes.

:mod:`.store` is the Memory object, a thin public face over parts with one job each:
:mod:`.values` (reads and writes, via the scripts in :mod:`.lua`), :mod:`.scope` (the
scope's Redis keys and its change log), :mod:`.feed` and :mod:`.listener` (the one
background thread per Memory that turns notifications into woken waiters and subscriber
callbacks), :mod:`.waits` (blocking reads), :mod:`.subscriptions` (callbacks) and
:mod:`.reserved` (the Ruby gem's reserved keys ``data``, ``results``, ``messages``,
``session_id``). Arrows point down that list; nothing below imports :mod:`.store`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Memory"]


def __getattr__(name: str) -> Any:
    if name == "Memory":  # lazy: start-up time (the store imports redis-py)
        from robot_lab.memory.store import Memory  # lazy: start-up time

        return Memory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
