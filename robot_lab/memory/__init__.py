"""Shared Memory: a Redis hash per scope with a version counter, a change stream and
pub/sub, so blocking reads and subscriptions work across processes.

:mod:`.store` is the Memory object (reads, writes, waits, subscriptions), :mod:`.listener`
the one background thread per Memory that turns notifications into woken waiters and
subscriber callbacks, :mod:`.reserved` the robot_lab reserved keys (``data``, ``results``,
``session_id``, ``cache``), :mod:`.lua` the write and compare-and-set scripts.
"""

from __future__ import annotations

from robot_lab.memory.store import Memory

__all__ = ["Memory"]
