"""A ``robot-lab worker``'s rq loop that ends on an error of its own (rq: "found an unhandled
exception, quitting") is started again, after a backoff; only a stop request ends it. Before,
the worker then exited with status 0 (under honcho: the whole Procfile stopped) or stayed up
taking no job."""

from __future__ import annotations

from typing import Any

import pytest

from robot_lab.network.serializer import JobSerializer
from robot_lab.workers import process
from tests.worker_procs import uid


def test_an_rq_loop_ended_by_an_error_is_started_again_until_asked_to_stop(
        real_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rq import Queue
    from rq.exceptions import StopRequested

    queue = Queue(f"robot:loop-{uid()}", connection=real_client, serializer=JobSerializer)
    worker = process.robot_worker_class()([queue], connection=real_client, serializer=JobSerializer,
                                          name=f"loop-{uid()}")
    calls: list[str] = []

    def dequeue(timeout: Any, max_idle_time: Any = None) -> Any:
        calls.append("dequeue")
        if len(calls) == 1:
            raise RuntimeError("a bug in the loop")  # rq logs it and quits its loop
        worker._stop_requested = True  # then a stop request ends the loop for good
        raise StopRequested()

    monkeypatch.setattr(worker, "dequeue_job_and_maintain_ttl", dequeue)
    process._work(worker, burst=False)
    assert calls == ["dequeue", "dequeue"]
