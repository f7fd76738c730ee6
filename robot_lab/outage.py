"""Riding out Redis outages: which errors mean "Redis is away for a while", a capped
exponential backoff with jitter, and a tracker that logs one line per state change.

A Redis restart, a Sentinel failover or a cluster resharding makes every long-running loop
(worker bus threads, the sweeper, the rq loop, a waiting coordinator, ``robot-lab watch``)
see the same errors for a few seconds to minutes. Each such loop owns one
:class:`OutageTracker`: the first failure logs ``redis.lost`` (a warning, no traceback), the
first success after it logs ``redis.back`` with how long it was down, and the retries in
between are silent. The delays come from :class:`Backoff` (full-range jitter on the upper
half of a doubling, capped delay) so a fleet of workers does not reconnect in lock step.

Redis out of memory (``OOM command not allowed``, ``maxmemory`` reached under ``noeviction``)
is an outage too: it passes when keys expire or an operator frees memory, and every loop
waits for that the same way. Calls that answer a user (``Bus.publish``, a submit, the CLI)
raise :class:`~robot_lab.errors.RedisOutOfMemory` instead (:func:`out_of_memory`).

Errors that are not an outage -- a wrong password (``AuthenticationError`` is a subclass of
``ConnectionError``), a script bug, ``WRONGTYPE`` -- are not retried here: they are a
problem for the caller to report.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis.exceptions as rx

from robot_lab.errors import RedisOutOfMemory
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings

log = get_logger("robot_lab.redis")

T = TypeVar("T")

# Out of memory, a loop's reads succeed between refused writes: it counts as back only after
# this many seconds without a failure, so one outage logs one redis.lost / redis.back pair.
OOM_QUIET = 3.0

# Transient by nature: the server is restarting / loading its AOF / failing over / a
# cluster slot has no master yet. ReadOnlyError: a client still talks to a demoted master.
# Only redis-py's own errors: the builtin TimeoutError / ConnectionResetError under a model
# provider's HTTP timeout (httpx) or rq's job timeout are not Redis being away.
_OUTAGE = (rx.ConnectionError, rx.TimeoutError, rx.ReadOnlyError, rx.ClusterDownError, rx.TryAgainError)
_NOT_OUTAGE = (rx.AuthenticationError, rx.AuthorizationError)
_OUTAGE_REPLIES = ("LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


def is_oom(exc: BaseException) -> bool:
    """True when Redis refused a write for lack of memory (``maxmemory``, ``noeviction``)."""
    return isinstance(exc, rx.OutOfMemoryError) or (isinstance(exc, rx.ResponseError) and str(exc).startswith("OOM"))


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` means Redis is (temporarily) unreachable or out of memory, not that a
    command is wrong."""
    if isinstance(exc, _NOT_OUTAGE):
        return False
    if isinstance(exc, _OUTAGE) or is_oom(exc):
        return True
    if isinstance(exc, rx.ResponseError):
        return str(exc).startswith(_OUTAGE_REPLIES)
    return isinstance(exc, rx.RedisClusterException) and "connect" in str(exc).lower()


def outage_cause(exc: BaseException) -> BaseException | None:
    """The outage error in ``exc``'s cause/context chain (``exc`` itself included), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if is_outage(current):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def caused_by_outage(exc: BaseException) -> bool:
    """True when ``exc`` or anything in its cause/context chain is a Redis client's outage
    error (a robot's run that failed because a callback could not reach Redis). A provider
    timeout is not: its chain holds builtin TimeoutErrors, never redis-py's."""
    return outage_cause(exc) is not None


@contextmanager
def out_of_memory(what: str) -> Iterator[None]:
    """Turn Redis's OOM refusal inside the block into one clear
    :class:`~robot_lab.errors.RedisOutOfMemory` naming ``what`` was refused."""
    try:
        yield
    except rx.RedisError as exc:
        if not is_oom(exc):
            raise

        raise RedisOutOfMemory(
            f"Redis is out of memory: {what} was refused and not written ({describe(exc)}); free memory "
            "(expire or delete keys, `robot-lab dlq purge`) or raise maxmemory, then retry") from None


def describe(exc: BaseException) -> str:
    """A one-line description of a Redis error (no traceback, no URL credentials: redis-py
    names only host and port)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Backoff:
    """Capped exponential backoff with jitter: attempt ``n`` waits a random time in
    ``[d/2, d]`` with ``d = min(cap, initial * 2**n)``. ``reset()`` after a success."""

    def __init__(self, initial: float | None = None, cap: float | None = None,
                 rng: random.Random | None = None) -> None:
        if initial is None or cap is None:
            settings = get_settings()
            initial = settings.redis_retry_initial if initial is None else initial
            cap = settings.redis_retry_max if cap is None else cap
        self.initial = max(0.001, float(initial))
        self.cap = max(self.initial, float(cap))
        self.attempt = 0
        # without one given, the process's shared generator: seeding a Random of its own
        # (2.5 KB from os.urandom) cost each network task ~2% of a busy worker's CPU, for
        # a jitter drawn only during an outage
        self._rng = rng

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.initial * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return ceiling / 2 + (self._rng or random).uniform(0, ceiling / 2)

    def reset(self) -> None:
        self.attempt = 0


class OutageTracker:
    """Up/down state of one loop's view of Redis; logs only the transitions.

    ``component`` names the loop in the log lines (``bus-billing``, ``sweeper``, ``rq``,
    ``coordinator``, ``watch``). Thread-safe: a loop and its helper thread may share one.
    """

    def __init__(self, component: str, *, backoff: Backoff | None = None, logger: Any = None) -> None:
        self.component = component
        self.backoff = backoff or Backoff()
        self.log = logger or log
        self.down_since: float | None = None
        self.failures = 0
        self.outages = 0
        self._oom_at: float | None = None  # last failure, when the outage is Redis out of memory
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def lost(self, exc: BaseException) -> None:
        """Record a failed attempt; the first one after being up logs ``redis.lost``."""
        with self._lock:
            self.failures += 1
            self._oom_at = time.monotonic() if is_oom(exc) else None
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
            self.outages += 1
        self.log.warning("redis.lost", component=self.component, error=describe(exc))

    def back(self) -> None:
        """Record a success; the first one after an outage logs ``redis.back``."""
        if self.down_since is None:  # the common case: no lock, no log
            return
        with self._lock:
            if self.down_since is None:
                return
            if self._oom_at is not None and time.monotonic() - self._oom_at < OOM_QUIET:
                return  # out of memory, reads still succeed: back only after a quiet while
            down_for = time.monotonic() - self.down_since
            failures, self.failures, self.down_since = self.failures, 0, None
            self.backoff.reset()
        self.log.warning("redis.back", component=self.component, down_for=round(down_for, 2), attempts=failures)

    def pause(self, stop: threading.Event | None = None) -> bool:
        """Wait the next backoff delay (returns early, True, when ``stop`` is set)."""
        delay = self.backoff.next_delay()
        if stop is not None:
            return stop.wait(delay)
        time.sleep(delay)
        return False

    def call(self, fn: Callable[[], T], *, stop: threading.Event | None = None,
             on_retry: Callable[[], Any] | None = None) -> T:
        """``fn()``, retried through an outage until it succeeds (or ``stop`` is set, which
        re-raises the last outage error). Non-outage errors propagate at once."""
        while True:
            try:
                value = fn()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self.lost(exc)
                if on_retry is not None:
                    on_retry()
                if self.pause(stop):
                    raise
                continue
            self.back()
            return value


def ride_out(fn: Callable[[], T], component: str, *, stop: threading.Event | None = None) -> T:
    """One-off :meth:`OutageTracker.call` with a fresh tracker."""
    return OutageTracker(component).call(fn, stop=stop)
