"""The per-Memory background listener: pub/sub for speed, the change stream for truth.

One daemon thread per Memory (started and retired by :mod:`.feed`) holds a pub/sub
subscription to the scope's notify channel. Every notification carries the full
:class:`MemoryChange`, so the common case costs no extra round trip. The listener keeps
``head``, the last version it processed, and never trusts pub/sub for completeness:

* a notification whose version is not ``head + 1`` (a message was lost, or the connection
  dropped and came back) makes it read the missing versions from the change stream first;
* redis-py re-subscribes after a reconnect, and the new ``subscribe`` confirmation triggers
  the same catch-up;
* when idle, it polls the version counter every ``poll_interval`` seconds and catches up if
  the counter moved (covers a lost last message).

Versions at or below ``head`` are dropped, so a change is never processed twice. Waiters
(blocking reads) are woken and subscription callbacks run on this thread, in version order.
Each subscription also keeps its own cursor, so a subscription that starts from an older
version (``since_version`` or a durable ``subscriber_id``) is replayed from the stream.

The listener knows nothing of Memory: it gets the scope's :class:`~.scope.ChangeLog`
(version counter, change stream, cursors), and from its :class:`~.feed.Feed` a
``may_retire`` callback and an ``owner`` token that names whose thread it is.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import redis

from robot_lab.logging import get_logger
from robot_lab.memory.scope import ChangeLog, decode_change
from robot_lab.schemas import MemoryChange

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.memory")


@dataclass(eq=False)
class Waiter:
    """A blocked ``get(..., wait=...)``: woken with the value of the first ``set`` per key."""

    keys: frozenset[str]
    event: threading.Event = field(default_factory=threading.Event)
    values: dict[str, Any] = field(default_factory=dict)
    closed: bool = False


@dataclass(eq=False)
class Subscription:
    """One ``subscribe``/``subscribe_pattern`` registration and its delivery cursor."""

    id: str
    callback: Callable[..., Any]
    version: int
    keys: frozenset[str] | None = None
    pattern: re.Pattern[str] | None = None
    subscriber_id: str | None = None
    transactional: bool = False

    def matches(self, key: str) -> bool:
        if self.keys is not None:
            return key in self.keys
        return bool(self.pattern and self.pattern.match(key))


class Listener(threading.Thread):
    """Background pub/sub reader for one memory scope (see the module docstring)."""

    def __init__(self, changelog: ChangeLog, *, poll_interval: float, idle_timeout: float | None,
                 may_retire: Callable[[Listener], bool], owner: object) -> None:
        super().__init__(name=f"robot-lab-memory:{changelog.keys.scope}", daemon=True)
        self.changelog = changelog
        self.scope = changelog.keys.scope
        self.owner = owner  # whose listener this is: a callback may not wait on its own owner
        self.redis: RedisClient = changelog.redis
        self._may_retire = may_retire
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.head = 0
        self.retired = False
        self._idle_since: float | None = None
        # Held while changes are processed; subscribe() takes it to replay a backlog
        # without interleaving with live delivery. Re-entrant: callbacks may subscribe.
        self.dispatch_lock = threading.RLock()
        self.waiters: dict[str, set[Waiter]] = {}
        self.waiters_lock = threading.Lock()
        self.subscriptions: dict[str, Subscription] = {}
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._pubsub: Any = None
        self._last_poll = time.monotonic()

    # --- lifecycle ------------------------------------------------------------------------
    def start_and_wait(self, timeout: float = 10.0) -> None:
        self.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise ConnectionError(
                f"memory {self.scope!r}: listener could not subscribe within {timeout} s"
                + (f" ({self._error})" if self._error else "")
            )

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        self._close_pubsub()
        with self.waiters_lock:
            waiters = [w for ws in self.waiters.values() for w in ws]
            self.waiters.clear()
        for waiter in waiters:
            waiter.closed = True
            waiter.event.set()

    def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def _connect(self) -> None:
        pubsub = self.redis.pubsub()
        try:
            pubsub.subscribe(self.changelog.keys.channel)
            deadline = time.monotonic() + 10
            while True:
                message = pubsub.get_message(timeout=0.5)
                if message and message["type"] == "subscribe":
                    break
                if time.monotonic() > deadline:
                    raise redis.ConnectionError("no subscribe confirmation within 10 s")
        except BaseException:
            pubsub.close()
            raise
        self._pubsub = pubsub
        with self.dispatch_lock:
            if not self._ready.is_set():
                # First connection: deliver only what is written from now on.
                self.head = self.changelog.version()
            else:
                self.catch_up()

    def run(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            try:
                if self._pubsub is None:
                    self._connect()
                    self._ready.set()
                    backoff = 0.05
                message = self._pubsub.get_message(timeout=min(0.25, self.poll_interval))
                if message is None:
                    if time.monotonic() - self._last_poll >= self.poll_interval:
                        self._last_poll = time.monotonic()
                        with self.dispatch_lock:
                            self.catch_up()
                    if self._idle_expired() and self._retire():
                        break
                    continue
                kind = message["type"]
                if kind == "message":
                    try:
                        change = decode_change(message["data"])
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        # Not ours (someone PUBLISHed junk): the stream is the truth.
                        log.warning("memory.bad_notification", scope=self.scope, error=str(exc))
                        with self.dispatch_lock:
                            self.catch_up()
                        continue
                    self.on_change(change)
                elif kind == "subscribe":  # redis-py re-subscribed after a reconnect
                    with self.dispatch_lock:
                        self.catch_up()
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                if self._stopping.is_set():
                    break
                self._error = exc
                log.warning("memory.listener_reconnect", scope=self.scope, error=str(exc))
                self._close_pubsub()
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception as exc:  # noqa: BLE001 - the listener must outlive bad input
                if self._stopping.is_set():
                    break
                log.exception("memory.listener_error", scope=self.scope, error=str(exc))
                self._stopping.wait(0.05)
        self._close_pubsub()

    def _idle_expired(self) -> bool:
        """True once nobody has waited or subscribed for ``idle_timeout`` seconds."""
        if self.idle_timeout is None or self.subscriptions or self.waiters:
            self._idle_since = None
            return False
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since >= self.idle_timeout

    def _retire(self) -> bool:
        """Exit an idle listener, so a worker that waits on many short-lived run scopes
        doesn't keep a thread and a connection per scope. The feed decides, under the lock
        it registers under, so nothing can be registered on a retiring listener."""
        if not self._may_retire(self):
            return False
        log.debug("memory.listener_retired", scope=self.scope)
        return True

    def idle(self) -> bool:
        """Nobody waits and nothing is subscribed (the feed checks this before retiring)."""
        return not self.subscriptions and not self.waiters

    # --- processing ----------------------------------------------------------------------
    def on_change(self, change: MemoryChange) -> None:
        with self.dispatch_lock:
            if change.version <= self.head:
                return
            if change.version > self.head + 1:
                self.catch_up()  # reads through the stream's end, including this one
                if change.version <= self.head:
                    return
            self._process(change)
            self.head = change.version

    def catch_up(self) -> None:
        """Process every change after ``head`` from the stream (caller holds dispatch_lock).

        The version counter is read first and the stream only up to it: a write racing with
        the catch-up is left for its own notification instead of being mistaken for a gap.
        """
        current = self.changelog.version()
        if current <= self.head:
            return
        for change in list(self.changelog.read(self.head, current)):
            if change.version > self.head:
                self._process(change)
                self.head = change.version
        if current > self.head:  # trimmed or expired away before we could read them
            self.changelog.note_lost(current - self.head)
            self.head = current

    def _process(self, change: MemoryChange) -> None:
        if change.op == "set":
            with self.waiters_lock:
                waiters = list(self.waiters.get(change.key, ()))
            for waiter in waiters:
                waiter.values.setdefault(change.key, change.value)
                waiter.event.set()
        for sub in list(self.subscriptions.values()):
            self.deliver(sub, change)

    def deliver(self, sub: Subscription, change: MemoryChange) -> None:
        """Run one subscription's callback for one change, at most once per version."""
        if change.version <= sub.version:
            return
        sub.version = change.version
        if not sub.matches(change.key):
            return
        try:
            if sub.transactional:
                pipe = self.redis.pipeline(transaction=True)
                sub.callback(change, pipe)
                if sub.subscriber_id:
                    self.changelog.save_cursor(sub.subscriber_id, change.version, pipe)
                pipe.execute()
                return
            sub.callback(change)
        except Exception as exc:  # noqa: BLE001 - robot_lab logs and swallows callback errors
            log.exception("memory.callback_failed", scope=self.scope, key=change.key,
                          version=change.version, subscription=sub.id, error=str(exc))
        if sub.subscriber_id:
            self.changelog.save_cursor(sub.subscriber_id, change.version)

    # --- registration --------------------------------------------------------------------
    def add_waiter(self, waiter: Waiter) -> None:
        with self.waiters_lock:
            for key in waiter.keys:
                self.waiters.setdefault(key, set()).add(waiter)

    def remove_waiter(self, waiter: Waiter) -> None:
        with self.waiters_lock:
            for key in waiter.keys:
                bucket = self.waiters.get(key)
                if bucket is not None:
                    bucket.discard(waiter)
                    if not bucket:
                        del self.waiters[key]

    def add_subscription(self, sub: Subscription) -> None:
        """Register ``sub``, first replaying versions between its cursor and ``head``."""
        with self.dispatch_lock:
            if sub.version < self.head:
                for change in list(self.changelog.read(sub.version, self.head)):
                    self.deliver(sub, change)
                sub.version = max(sub.version, self.head)
            self.subscriptions[sub.id] = sub
