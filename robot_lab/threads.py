"""Thread pools whose threads exist before the first burst of work.

``ThreadPoolExecutor`` starts a thread when a submit finds none idle, and ``Thread.start``
waits until the new thread runs. A burst of N jobs therefore made the one thread that hands
them out (the in-flight rq loop, a bus poller) wait for N thread starts, each queued behind
every running job for the GIL: 200 starts were about a tenth of a second of a 200-task
fan-out (bench/concurrency.py). :func:`warm_pool` starts them all when the pool is made,
while the worker is idle.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from robot_lab.logging import get_logger

log = get_logger("robot_lab.threads")
START_TIMEOUT = 60.0


def warm_pool(size: int, name: str) -> ThreadPoolExecutor:
    """A ``ThreadPoolExecutor`` of ``size`` threads, every one of them already running.

    Each of ``size`` start-up tasks waits at a barrier, so every submit finds no idle thread
    and starts one; then the barrier opens and the threads wait for work like any pool's."""
    pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)
    if size <= 1:
        return pool
    gate = threading.Barrier(size + 1, timeout=START_TIMEOUT)
    try:
        for _ in range(size):
            pool.submit(gate.wait)
        gate.wait()
    except (RuntimeError, threading.BrokenBarrierError) as exc:
        # "can't start new thread" (a pids or thread limit): release those started, and let
        # the pool start the rest on demand, as a plain pool would
        gate.abort()
        log.warning("threads.warm_pool_incomplete", pool=name, size=size, error=f"{type(exc).__name__}: {exc}")
    return pool
