"""rq's bookkeeping of a robot-lab worker itself stays sparse (workers/health.py
LoopProgress): the worker key is beaten at most every BEAT_EVERY seconds, the worker's state
is written when it changes (and again after an outage lost a write), the suspension flag is
read at most every SUSPENSION_EVERY seconds -- while the loop's progress, which the health
probe reads, is recorded on every call."""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions as rx

from robot_lab.workers import health
from robot_lab.workers.health import LoopProgress
from robot_lab.workers.supervision import RidesOutages


class RecordingWorker:
    """What rq's worker would do, recorded: each call here is a round trip to Redis."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_writes = False
        self._state = "?"

    def heartbeat(self, timeout: Any = None, pipeline: Any = None) -> None:
        self.calls.append(("heartbeat", timeout, pipeline))

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if self.fail_writes:
            raise rx.ConnectionError("Redis went away")
        self._state = state
        self.calls.append(("state", state, pipeline))

    def check_for_suspension(self, burst: bool) -> None:
        self.calls.append(("suspension", burst))

    def execute_job(self, job: Any, queue: Any) -> None:  # the job's end rides with its result
        self.set_state("idle", pipeline="result")
        raise rx.ConnectionError("Redis went away before that pipeline went out")


class Worker(LoopProgress, RidesOutages, RecordingWorker):
    name = "w"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: now[0])
    return now


def test_the_worker_key_is_beaten_at_most_every_beat_every_but_progress_always(clock: list[float]) -> None:
    worker = Worker()
    for _ in range(3):  # rq beats three times per job
        worker.heartbeat()
        clock[0] += 0.01
    assert [c[0] for c in worker.calls] == ["heartbeat"]
    assert worker.loop_beat == clock[0] - 0.01  # the health probe sees every round
    clock[0] += health.BEAT_EVERY
    worker.heartbeat()
    worker.heartbeat(90)  # an explicit ttl (rq's job monitoring) or a pipeline always goes out
    worker.heartbeat(pipeline="pipe")
    assert worker.calls[1:] == [("heartbeat", None, None), ("heartbeat", 90, None), ("heartbeat", None, "pipe")]


def test_the_state_is_written_when_it_changes_and_again_after_a_lost_write(clock: list[float]) -> None:
    worker = Worker()
    worker.set_state("busy", pipeline="claim")  # rides with the task's claim
    worker.set_state("idle", pipeline="result")  # rides with its result
    worker.set_state("idle")  # rq's loop before the next dequeue: nothing to write
    assert worker.calls == [("state", "busy", "claim"), ("state", "idle", "result")]
    assert worker._state == "idle"
    worker.fail_writes = True
    worker.set_state("busy")  # an outage: RidesOutages keeps the loop up, the write is lost
    worker.fail_writes = False
    worker.set_state("busy")
    assert worker.calls[-1] == ("state", "busy", None)


def test_an_interrupted_job_makes_the_next_state_write_go_out(clock: list[float]) -> None:
    class Job:
        id = "j"
        timeout = None

    class Queue:
        name = "q"

    worker = Worker()
    worker._ride_out = lambda fn: None  # type: ignore[method-assign]  (no requeue: no Redis here)
    worker.execute_job(Job(), Queue())
    worker.set_state("idle")
    assert worker.calls[-1] == ("state", "idle", None)


def test_the_suspension_flag_is_read_at_most_every_suspension_every(clock: list[float]) -> None:
    worker = Worker()
    worker.check_for_suspension(False)
    clock[0] += health.SUSPENSION_EVERY / 2
    worker.check_for_suspension(False)
    assert worker.calls == [("suspension", False)]
    clock[0] += health.SUSPENSION_EVERY
    worker.check_for_suspension(True)
    assert worker.calls == [("suspension", False), ("suspension", True)]
