"""Thread pools that start threads on demand without making the submitter wait.

``ThreadPoolExecutor`` starts a thread when a submit finds none idle, and ``Thread.start``
waits until the new thread runs. A burst of N jobs therefore made the one thread that hands
them out (the in-flight rq loop, a bus poller) wait for N thread starts, each queued behind
every running job for the GIL: 200 starts were about a tenth of a second of a 200-task
fan-out (bench/concurrency.py). Starting every slot's thread up front avoids that but holds
a thread per slot from the start: 2,000 idle threads (~40 MB) for ``--in-flight 1000``.
:class:`ElasticPool` keeps a few warm and has a starter thread of its own start the rest as
work arrives, and lets them go when idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from robot_lab.logging import get_logger

log = get_logger("robot_lab.threads")


class ElasticPool:
    """Up to ``size`` threads, ``warm`` of them started when the pool is made and the rest
    started on demand by a starter thread of the pool's own, so a burst of submits never
    waits for ``Thread.start`` (each waits until the new thread runs: behind every running
    job for the GIL) and a process with a thousand slots does not hold a thousand idle
    threads from the start. A thread beyond ``warm`` exits after ``idle_timeout`` seconds
    without work. ``submit`` and ``shutdown`` as ``ThreadPoolExecutor``'s, minus futures."""

    def __init__(self, size: int, name: str, *, warm: int = 16, idle_timeout: float = 30.0) -> None:
        import queue  # lazy: start-up time

        self.size, self.name, self.idle_timeout = max(1, size), name, idle_timeout
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting for work that no submit has claimed yet
        self._owed = 0  # threads the starter is to start
        self._wake = threading.Event()
        self._closed = False
        self._keep = min(self.size, max(0, warm))
        self._starter: threading.Thread | None = None
        with self._lock:
            self._owed = self._idle = self._keep  # the warm threads: idle from the start
        self._start_owed()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"pool {self.name} is shut down")
            self._work.put((fn, args))
            if self._idle > 0:
                self._idle -= 1
                return
            if len(self._threads) + self._owed >= self.size:
                return  # every thread busy: the work waits for the first one free
            self._owed += 1
            if self._starter is None:
                self._starter = threading.Thread(target=self._start_loop, name=f"{self.name}-starter", daemon=True)
                self._starter.start()
        self._wake.set()

    def _start_loop(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            self._start_owed()

    def _start_owed(self) -> None:
        while True:
            with self._lock:
                if self._owed <= 0 or self._closed:
                    return
                self._owed -= 1
                thread = threading.Thread(target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.add(thread)
            try:
                thread.start()
            except RuntimeError as exc:  # a thread limit: the threads running serve the rest
                # Logged before the thread leaves the set: a shutdown waiting for it returns
                # only after the warning is out.
                log.warning("threads.pool_start_failed", pool=self.name, threads=len(self._threads) - 1,
                            error=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self._threads.discard(thread)
                    self._owed = 0
                return

    def _serve(self) -> None:
        import queue  # lazy: start-up time

        me = threading.current_thread()
        while True:
            try:
                item = self._work.get(timeout=self.idle_timeout)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0 and len(self._threads) > self._keep:
                        self._idle -= 1
                        self._threads.discard(me)
                        return
                continue
            if item is None:
                with self._lock:
                    self._threads.discard(me)
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - a pool thread never dies of a job
                log.error("threads.job_failed", pool=self.name, error=f"{type(exc).__name__}: {exc}")
            finally:
                del item, fn, args
            with self._lock:
                self._idle += 1

    def threads(self) -> int:
        with self._lock:
            return len(self._threads)

    def shutdown(self, wait: bool = True) -> None:
        """Take no more work; the work queued still runs; with ``wait``, until it has."""
        self._start_owed()  # the threads queued work is owed, before no more start
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        self._wake.set()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                while thread.ident is None and thread in self._threads:  # the starter is starting it
                    time.sleep(0.001)
                if thread.ident is not None:
                    thread.join()


_shared_lock = threading.Lock()
_shared: ElasticPool | None = None
_shares = 0


class PoolShare:
    """``size`` slots of the process's one shared :class:`ElasticPool` (made by the first
    share, grown by each share's size, shut down with the last). ``robot-lab worker`` runs
    its rq jobs and every served robot's bus messages on one pool, so a thread a bus burst
    started serves the next fan-out's tasks instead of idling beside a thread of its own:
    a 1000-message burst and a 1000-task fan-out held 1,836 threads (146 MB) with a pool
    each (bench/concurrency.py). Each user keeps its own limit (the in-flight loop and the
    bus poller take only as much work as they have free slots); ``shutdown(wait=True)``
    waits for this share's own work only."""

    def __init__(self, size: int, name: str) -> None:
        global _shared, _shares
        self.size, self.name = max(1, size), name
        self._cond = threading.Condition()
        self._running = 0  # submitted by this share, not finished
        self._closed = False
        with _shared_lock:
            if _shared is None:
                _shared = ElasticPool(self.size, "pool")
            else:
                with _shared._lock:
                    _shared.size += self.size
            self._pool = _shared
            _shares += 1

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"pool share {self.name} is shut down")
            self._running += 1
        try:
            self._pool.submit(self._run, fn, args)
        except BaseException:
            self._done()
            raise

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - a pool thread never dies of a job
            log.error("threads.job_failed", pool=self.name, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._done()

    def _done(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def threads(self) -> int:
        """Threads of the shared pool (every share's)."""
        return self._pool.threads()

    def shutdown(self, wait: bool = True) -> None:
        """Take no more work; what this share submitted still runs; with ``wait``, until it has."""
        global _shared, _shares
        with self._cond:
            first, self._closed = not self._closed, True
        if first:
            last = False
            with _shared_lock:
                _shares -= 1
                with self._pool._lock:
                    self._pool.size = max(1, self._pool.size - self.size)
                if _shares == 0 and _shared is self._pool:
                    _shared, last = None, True
            if last:
                self._pool.shutdown(wait=False)  # queued work still runs (waited for below)
        if wait:
            with self._cond:
                while self._running > 0:
                    self._cond.wait()
