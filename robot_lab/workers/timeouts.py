"""Job timeouts for the in-flight worker: rq's ``TimerDeathPenalty`` on one watchdog thread.

Jobs on pool threads cannot use SIGALRM (main thread only), so rq's answer is
``TimerDeathPenalty``: a ``threading.Timer`` per job that raises the timeout exception in the
job's thread (``PyThreadState_SetAsyncExc``). A Timer is a thread, and ``Thread.start`` waits
until it runs: with 200 jobs in flight that is 200 thread starts (and 200 more threads) per
wave, each queued behind every running job for the GIL. :class:`SharedTimerDeathPenalty`
keeps rq's mechanism and messages -- the same exception, raised the same way -- but one
daemon thread per process watches every deadline.

A deadline is fired or cancelled under one lock, so once ``cancel_death_penalty`` returns the
job's thread gets no exception; one fired just before is raised in the job's thread at its
next instruction, which rq's ``BaseDeathPenalty.__exit__`` already tolerates (as with a
Timer that fires while it is being cancelled).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from typing import Any

from rq.timeouts import JobTimeoutException, TimerDeathPenalty


class _Watchdog:
    """The process's one thread that fires due deadlines (started on first use and again in a
    forked child)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.lock = threading.Condition()
        self.heap: list[tuple[float, int, SharedTimerDeathPenalty]] = []
        self.order = itertools.count()
        self.cancelled = 0  # cancelled entries still in the heap
        self.thread: threading.Thread | None = None

    def add(self, penalty: SharedTimerDeathPenalty, deadline: float) -> None:
        with self.lock:
            heapq.heappush(self.heap, (deadline, next(self.order), penalty))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="rq-job-timeouts", daemon=True)
                self.thread.start()
            if self.heap[0][2] is penalty:  # the earliest now: the thread sleeps too long
                self.lock.notify()

    def cancel(self, penalty: SharedTimerDeathPenalty) -> None:
        """Disarm ``penalty`` (under the lock: it cannot fire after this returns). Cancelled
        entries leave the heap when they come up, or all at once when they are most of it
        (jobs end long before their timeouts, so most entries are cancelled ones)."""
        with self.lock:
            if not penalty.armed:
                return
            penalty.armed = False
            self.cancelled += 1
            if self.cancelled > 64 and self.cancelled * 2 > len(self.heap):
                self.heap = [entry for entry in self.heap if entry[2].armed]
                heapq.heapify(self.heap)
                self.cancelled = 0

    def _loop(self) -> None:
        with self.lock:
            while True:
                while self.heap and not self.heap[0][2].armed:  # cancelled: forget it
                    heapq.heappop(self.heap)
                    self.cancelled = max(0, self.cancelled - 1)
                if not self.heap:
                    self.lock.wait()
                    continue
                deadline, _, penalty = self.heap[0]
                now = time.monotonic()
                if deadline > now:
                    self.lock.wait(deadline - now)
                    continue
                heapq.heappop(self.heap)
                penalty.armed = False
                try:
                    penalty.handle_death_penalty()
                except (ValueError, SystemError):  # the job's thread is gone: nothing to stop
                    pass


_watchdog = _Watchdog()


class SharedTimerDeathPenalty(TimerDeathPenalty):
    """rq's ``TimerDeathPenalty`` without a thread per job (see the module docstring)."""

    def __init__(self, timeout: Any, exception: type[BaseException] = JobTimeoutException, **kwargs: Any) -> None:
        super().__init__(timeout, exception, **kwargs)
        self.armed = False

    def setup_death_penalty(self) -> None:
        if self._timeout <= 0:
            return
        self.armed = True
        _watchdog.add(self, time.monotonic() + self._timeout)

    def cancel_death_penalty(self) -> None:
        if self._timeout <= 0:
            return
        _watchdog.cancel(self)
