"""One Memory's listener slot: start the listener on demand, retire it when idle, close it.

Waits (:mod:`.waits`) and subscriptions (:mod:`.subscriptions`) register on the live
listener through :meth:`Feed.with_listener`. Registration and retirement take the same lock,
so a waiter or subscription is never registered on a listener that is about to exit; that
lock is the whole contract between the listener thread and its owner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from robot_lab.memory.listener import Listener
from robot_lab.memory.scope import ChangeLog


class Feed:
    """Holds at most one live :class:`Listener` for a scope's :class:`ChangeLog`."""

    def __init__(self, changelog: ChangeLog, *, poll_interval: float, idle_timeout: float | None) -> None:
        self.changelog = changelog
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.listener: Listener | None = None
        # Re-entrant: a replayed callback may subscribe again while we register it.
        self._lock = threading.RLock()

    def with_listener(self, register: Callable[[Listener], None]) -> Listener:
        """Run ``register`` on a live listener, starting one if needed."""
        with self._lock:
            listener = self.listener
            if listener is None or listener.retired or not listener.is_alive():
                listener = Listener(self.changelog, poll_interval=self.poll_interval,
                                    idle_timeout=self.idle_timeout, may_retire=self._may_retire, owner=self)
                listener.start_and_wait()
                self.listener = listener
            register(listener)
            return listener

    def ensure_listener(self) -> Listener:
        return self.with_listener(lambda _: None)

    def on_listener_thread(self) -> bool:
        """True when called from this feed's listener (a subscription callback)."""
        current = threading.current_thread()
        return isinstance(current, Listener) and current.owner is self

    def _may_retire(self, listener: Listener) -> bool:
        """Called by an idle listener: let it exit unless something registered meanwhile."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if not listener.idle():
                return False
            listener.retired = True
            if self.listener is listener:
                self.listener = None
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the listener: subscriptions end, blocked waits raise."""
        with self._lock:
            listener, self.listener = self.listener, None
        if listener is not None:
            listener.stop()
