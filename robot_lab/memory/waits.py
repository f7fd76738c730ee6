"""Blocking reads: ``get(..., wait=...)`` without lost wake-ups.

The waiter is registered on the listener *before* the keys are read, so a write that lands
after the read is notified to a registered waiter, and a write before it is seen by the read.
Existence, not non-None-ness, satisfies a wait (a stored null is the bytes ``null``);
reserved keys always exist, so they never wait.
"""

from __future__ import annotations

import time
from typing import Any

from robot_lab.errors import AwaitTimeout, RobotLabError
from robot_lab.memory.feed import Feed
from robot_lab.memory.listener import Waiter
from robot_lab.memory.reserved import RESERVED_KEYS
from robot_lab.memory.values import Values


def wait_for(values: Values, feed: Feed, names: list[str], timeout: float | None) -> dict[str, Any]:
    """``{key: value}`` once every key in ``names`` exists, or :class:`AwaitTimeout`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waitable = frozenset(k for k in names if k not in RESERVED_KEYS)
    if waitable and feed.on_listener_thread():
        raise RobotLabError(f"memory {values.scope!r}: a subscription callback cannot block on get(wait=...) "
                            "of its own Memory (the listener delivering changes is the one waiting)")
    waiter = Waiter(waitable)
    # Register, then read: a write after the read is notified to a registered waiter.
    listener = feed.with_listener(lambda lst: lst.add_waiter(waiter)) if waitable else None
    try:
        raws = values.read_raw(names)
        found = {k: values.value(k, raws[k]) for k in names if raws[k] is not None or k in RESERVED_KEYS}
        missing = [k for k in names if k not in found]
        while missing:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                err = AwaitTimeout(f"Timeout waiting for {', '.join(':' + k for k in missing)} "
                                   f"after {timeout:g} seconds")
                err.keys = list(missing)  # type: ignore[attr-defined]
                err.timeout = timeout  # type: ignore[attr-defined]
                raise err
            waiter.event.wait(remaining)
            if waiter.closed:
                raise RobotLabError(f"memory {values.scope!r} was closed while waiting for {missing}")
            waiter.event.clear()
            for k in list(missing):
                if k in waiter.values:
                    found[k] = waiter.values[k]
                    missing.remove(k)
        return {k: found[k] for k in names}
    finally:
        if listener is not None:
            listener.remove_waiter(waiter)
