"""Blocking reads: ``get(..., wait=...)`` without lost wake-ups.

The waiter is registered on the listener *before* the keys are read, so a write that lands
after the read is notified to a registered waiter, and a write before it is seen by the read.
Existence, not non-None-ness, satisfies a wait (a stored null is the bytes ``null``);
reserved keys always exist, so they never wait.
"""

from __future__ import annotations

import asyncio
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
    waitable = _waitable(values, feed, names)
    waiter = Waiter(waitable)
    # Register, then read: a write after the read is notified to a registered waiter.
    listener = feed.with_listener(lambda lst: lst.add_waiter(waiter)) if waitable else None
    try:
        found, missing = _present(values, names, values.read_raw(names))
        while missing:
            waiter.event.wait(_remaining(deadline, missing, timeout))
            _collect(values, waiter, found, missing)
        return {k: found[k] for k in names}
    finally:
        if listener is not None:
            listener.remove_waiter(waiter)


async def await_for(values: Values, feed: Feed, aredis: Any, names: list[str], timeout: float | None
                    ) -> dict[str, Any]:
    """:func:`wait_for` for an event loop: the keys are read on the asyncio client
    ``aredis``; the wake-up comes from the Memory's one listener thread (shared by every
    waiter, sync or async) through ``call_soon_threadsafe``, so no thread blocks per wait."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waitable = _waitable(values, feed, names)
    event = _LoopEvent(asyncio.get_running_loop())
    waiter = Waiter(waitable, event=event)  # type: ignore[arg-type]
    listener = None
    if waitable:  # may start the listener (a subscribe round trip): off the loop
        listener = await asyncio.to_thread(feed.with_listener, lambda lst: lst.add_waiter(waiter))
    try:
        found, missing = _present(values, names, await values.aread_raw(aredis, names))
        while missing:
            await event.wait(_remaining(deadline, missing, timeout))
            _collect(values, waiter, found, missing)
        return {k: found[k] for k in names}
    finally:
        if listener is not None:
            listener.remove_waiter(waiter)


class _LoopEvent:
    """The part of ``threading.Event`` the listener uses (``set``), for a waiter on an
    event loop: ``set`` from the listener thread wakes the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def set(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float | None) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            pass


def _waitable(values: Values, feed: Feed, names: list[str]) -> frozenset[str]:
    waitable = frozenset(k for k in names if k not in RESERVED_KEYS)
    if waitable and feed.on_listener_thread():
        raise RobotLabError(f"memory {values.scope!r}: a subscription callback cannot block on get(wait=...) "
                            "of its own Memory (the listener delivering changes is the one waiting)")
    return waitable


def _present(values: Values, names: list[str], raws: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(values of the keys that exist, the names still missing)."""
    found = {k: values.value(k, raws[k]) for k in names if raws[k] is not None or k in RESERVED_KEYS}
    return found, [k for k in names if k not in found]


def _remaining(deadline: float | None, missing: list[str], timeout: float | None) -> float | None:
    """Seconds left to wait; AwaitTimeout naming the missing keys once none are."""
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        err = AwaitTimeout(f"Timeout waiting for {', '.join(':' + k for k in missing)} "
                           f"after {timeout:g} seconds")
        err.keys = list(missing)  # type: ignore[attr-defined]
        err.timeout = timeout  # type: ignore[attr-defined]
        raise err
    return remaining


def _collect(values: Values, waiter: Waiter, found: dict[str, Any], missing: list[str]) -> None:
    """After a wake-up: move the keys the listener delivered from ``missing`` to ``found``."""
    if waiter.closed:
        raise RobotLabError(f"memory {values.scope!r} was closed while waiting for {missing}")
    waiter.event.clear()
    for k in list(missing):
        if k in waiter.values:
            found[k] = waiter.values[k]
            missing.remove(k)
