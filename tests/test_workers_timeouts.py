"""robot_lab/workers/timeouts.py: rq's thread-raised job timeout, on one watchdog thread for
every job of a process instead of a Timer thread per job."""

from __future__ import annotations

import threading
import time

import pytest
from rq.timeouts import JobTimeoutException

from robot_lab.workers import timeouts
from robot_lab.workers.timeouts import SharedTimerDeathPenalty


def test_a_job_past_its_timeout_gets_rqs_exception_in_its_own_thread() -> None:
    caught: list[BaseException] = []

    def job() -> None:
        try:
            with SharedTimerDeathPenalty(1, JobTimeoutException, job_id="slow"):
                for _ in range(400):  # 4 s of Python work, interruptible
                    time.sleep(0.01)
        except JobTimeoutException as exc:
            caught.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=job)
    thread.start()
    thread.join(10)
    assert [str(e) for e in caught] == ["Task exceeded maximum timeout value (1 seconds)"]
    assert time.monotonic() - started < 3


def test_jobs_that_finish_in_time_are_left_alone_and_share_one_thread() -> None:
    errors: list[BaseException] = []

    def job(i: int) -> None:
        try:
            with SharedTimerDeathPenalty(1, JobTimeoutException, job_id=f"quick-{i}"):
                time.sleep(0.01)
            time.sleep(1.2)  # past the cancelled deadline: nothing may fire now
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(100)]
    for thread in threads:
        thread.start()
    watchdogs = [t for t in threading.enumerate() if t.name == "rq-job-timeouts"]
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert len(watchdogs) == 1
    assert len(timeouts._watchdog.heap) < 100  # cancelled entries do not pile up


@pytest.mark.parametrize("timeout", [0, -1])
def test_no_timeout_sets_nothing(timeout: int) -> None:
    penalty = SharedTimerDeathPenalty(timeout, JobTimeoutException)
    with penalty:
        pass
    assert not penalty.armed
