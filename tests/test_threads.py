"""robot_lab/threads.py: an ElasticPool keeps a few threads warm, starts the rest as work
arrives without making the submitter wait for thread starts, never runs more than its size
at once, and lets the extra threads go when idle."""

from __future__ import annotations

import threading
import time

import pytest

from robot_lab.threads import ElasticPool


def _named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix + "_")]


def test_warm_threads_first_then_threads_on_demand_up_to_the_size() -> None:
    pool = ElasticPool(12, "elastic-a", warm=3, idle_timeout=0.3)
    try:
        assert len(_named("elastic-a")) == 3  # the warm ones, before any work
        gate = threading.Barrier(12, timeout=20)  # twelve jobs at once need twelve threads
        done: list[int] = []
        started = time.monotonic()
        for i in range(12):
            pool.submit(lambda i=i: (gate.wait(), done.append(i)))
        submitted = time.monotonic() - started
        deadline = time.monotonic() + 20
        while len(done) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(done) == list(range(12)) and pool.threads() == 12
        assert submitted < 5  # the submits did not wait for the jobs (nor deadlock on them)
        deadline = time.monotonic() + 10
        while pool.threads() > 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.threads() == 3  # the extra threads went once idle; the warm ones stay
        more: list[int] = []
        for i in range(40):
            pool.submit(more.append, i)
        pool.shutdown(wait=True)
        assert sorted(more) == list(range(40))  # queued work still runs at shutdown
    finally:
        pool.shutdown(wait=True)


def test_never_more_jobs_at_once_than_its_size() -> None:
    pool = ElasticPool(4, "elastic-b", warm=0)
    lock = threading.Lock()
    now, most = [0], [0]

    def job() -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1

    for _ in range(40):
        pool.submit(job)
    pool.shutdown(wait=True)
    assert most[0] == 4 and pool.threads() == 0


def test_a_thread_limit_leaves_a_working_pool_and_a_warning(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where no more threads can start (a pids limit), the threads running serve the work."""
    from structlog.testing import capture_logs

    real_start = threading.Thread.start
    started = {"n": 0}

    def limited(self):  # type: ignore[no-untyped-def]
        if self.name.startswith("elastic-c_"):
            started["n"] += 1
            if started["n"] > 2:
                raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", limited)
    done: list[int] = []
    with capture_logs() as logs:
        pool = ElasticPool(8, "elastic-c", warm=0)
        for i in range(20):
            pool.submit(done.append, i)
        pool.shutdown(wait=True)
    assert sorted(done) == list(range(20))
    assert "threads.pool_start_failed" in [e["event"] for e in logs]


def test_pool_shares_use_one_pool_and_each_waits_for_its_own_work() -> None:
    """Two users (an rq loop and a bus poller, say) share the process's threads: a thread
    one share's burst started runs the other's work, and shutting one share down waits for
    its own work only."""
    from robot_lab.threads import PoolShare

    rq_share, bus_share = PoolShare(8, "rq-job"), PoolShare(8, "bus-x")
    assert rq_share._pool is bus_share._pool  # one pool for the process
    ran: dict[str, set[str]] = {"rq": set(), "bus": set()}
    gate = threading.Event()
    entered = threading.Condition()

    def bus_job() -> None:  # holds its thread until five run at once: the burst starts >= 5
        with entered:
            ran["bus"].add(threading.current_thread().name)
            entered.notify_all()
            entered.wait_for(lambda: len(ran["bus"]) >= 5, timeout=10)

    for _ in range(8):
        bus_share.submit(bus_job)
    bus_share.shutdown(wait=True)  # its burst is over
    pool = bus_share._pool
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the starter has started every thread the burst owed
        with pool._lock:
            if pool._owed == 0 and all(t.ident is not None for t in pool._threads):
                before = {t.name for t in pool._threads}
                break
        time.sleep(0.01)
    assert len(before) >= 5  # idle now: the rq share's five jobs need no new thread
    blocked = threading.Event()
    rq_share.submit(lambda: (blocked.set(), gate.wait(10)))
    for _ in range(4):
        rq_share.submit(lambda: ran["rq"].add(threading.current_thread().name))
    assert blocked.wait(60)
    waiter = threading.Thread(target=rq_share.shutdown, kwargs={"wait": True})
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # the rq share's own work is still running
    gate.set()
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(ran["bus"]) >= 1 and len(ran["rq"]) >= 1
    assert ran["rq"] <= before  # threads the bus share's burst had running ran the rq share's work
    with pytest.raises(RuntimeError):
        rq_share.submit(lambda: None)
