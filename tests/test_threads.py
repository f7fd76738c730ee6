"""robot_lab/threads.py: a pool's threads are running before its first job, so handing out a
burst of jobs never waits for thread starts."""

from __future__ import annotations

import threading

from robot_lab.threads import warm_pool


def test_every_thread_runs_before_the_first_job_and_then_serves_jobs() -> None:
    before = threading.active_count()
    pool = warm_pool(12, "warm-test")
    try:
        names = [t.name for t in threading.enumerate() if t.name.startswith("warm-test")]
        assert len(names) == 12 and threading.active_count() == before + 12
        gate = threading.Barrier(12, timeout=10)  # twelve jobs at once need all twelve threads
        assert sorted(pool.map(lambda i: (gate.wait(), i)[1], range(12))) == list(range(12))
        assert threading.active_count() == before + 12  # no thread started for them
    finally:
        pool.shutdown(wait=True)


def test_a_pool_of_one_starts_lazily_like_any_pool() -> None:
    pool = warm_pool(1, "warm-one")
    assert not [t for t in threading.enumerate() if t.name.startswith("warm-one")]
    assert pool.submit(lambda: 7).result(5) == 7
    pool.shutdown(wait=True)


def test_a_thread_limit_leaves_a_working_pool_and_a_warning(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where threads cannot all be started (a pids limit), the started ones are released and
    the pool still runs jobs, starting threads on demand like any pool."""
    from concurrent.futures import ThreadPoolExecutor

    from structlog.testing import capture_logs

    real_submit = ThreadPoolExecutor.submit
    calls = {"n": 0}

    def limited(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("can't start new thread")
        return real_submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", limited)
    with capture_logs() as logs:
        pool = warm_pool(8, "warm-limited")
    monkeypatch.setattr(ThreadPoolExecutor, "submit", real_submit)
    try:
        assert [e["event"] for e in logs] == ["threads.warm_pool_incomplete"]
        assert pool.submit(lambda: 5).result(5) == 5
    finally:
        pool.shutdown(wait=True)
