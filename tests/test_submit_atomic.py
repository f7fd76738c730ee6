"""A submit is all or nothing (robot_lab/network/submitting.py): a submit that fails at any
step leaves no record, index entry or rq job behind, and what a submit could not clean up
(Redis went away) is removed by the sweeper after the grace period -- never started later."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rq import Queue

from robot_lab.keys import default_keys
from robot_lab.network import coordinator as coordinator_module
from robot_lab.network import submitting
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.run_state import RunStore
from robot_lab.runtime.robot import build
from tests.worker_procs import uid


def _network(robot: str) -> Any:
    net = create_network(f"atomic-{uid()}")
    bot = build(robot, model="scripted/echo")
    net.task("a", bot)
    net.task("b", bot)
    net.task("c", bot, depends_on=["a", "b"])
    return net


def _traces(client: Any, run_id: str, queue: str) -> dict[str, Any]:
    keys = default_keys()
    return {"record": client.exists(keys.run(run_id)), "state": client.exists(keys.run(run_id) + ":state"),
            "index": client.zscore(keys.runs_index(), run_id), "active": client.sismember(keys.runs_active(), run_id),
            "queued": Queue(queue, connection=client).count}


def test_a_submit_failing_after_some_jobs_were_enqueued_leaves_nothing(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    robot = f"atomic-{uid()}"
    real_enqueue = coordinator_module.enqueue_jobs

    def half_then_fail(connection: Any, keys: Any, run_id: str, items: list[Any], graph: Any = None,
                       **kwargs: Any) -> None:
        real_enqueue(connection, keys, run_id, items[:1], graph, **kwargs)  # one job made it, then Redis refused
        raise RuntimeError("the second enqueue failed")

    monkeypatch.setattr(coordinator_module, "enqueue_jobs", half_then_fail)
    coordinator = Coordinator(connection=redis_client)
    with pytest.raises(RuntimeError, match="second enqueue"):
        coordinator.submit(_network(robot), "hello", run_id="atomic-1")
    assert _traces(redis_client, "atomic-1", f"robot:{robot}") == {
        "record": 0, "state": 0, "index": None, "active": 0, "queued": 0}
    assert coordinator.runs() == []


def test_a_submit_that_succeeds_is_no_longer_submitting(redis_client) -> None:  # type: ignore[no-untyped-def]
    handle = Coordinator(connection=redis_client).submit(_network(f"atomic-{uid()}"), "hello")
    assert redis_client.hget(RunStore(redis_client, default_keys(), handle.run_id).key, submitting.SUBMITTING) is None


def test_the_sweeper_removes_what_a_failed_submit_left(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A submit that could not even clean up (its process died, Redis went away): a record
    still submitting, with a queued job; and index entries of a run whose record was never
    written. Within the grace period both are left alone; after it the sweeper removes both."""
    robot = f"atomic-{uid()}"
    coordinator = Coordinator(connection=redis_client)
    monkeypatch.setattr(redis_client, "hdel", lambda *a: None)  # the submit dies before its last step
    handle = coordinator.submit(_network(robot), "hello", run_id="atomic-2")
    keys = default_keys()
    redis_client.sadd(keys.runs_active(), "atomic-ghost")
    redis_client.zadd(keys.runs_index(), {"atomic-ghost": time.time()})
    monkeypatch.undo()
    coordinator.sweep(min_interval_ms=1)
    assert _traces(redis_client, handle.run_id, f"robot:{robot}")["queued"] == 2  # within the grace: untouched
    assert redis_client.zscore(keys.runs_index(), "atomic-ghost") is not None
    monkeypatch.setattr(submitting, "GRACE", 0.0)
    redis_client.delete(f"{keys.prefix}:runs:sweep-lock")
    coordinator.sweep(min_interval_ms=1)
    assert _traces(redis_client, handle.run_id, f"robot:{robot}") == {
        "record": 0, "state": 0, "index": None, "active": 0, "queued": 0}
    assert redis_client.zscore(keys.runs_index(), "atomic-ghost") is None
    assert not redis_client.sismember(keys.runs_active(), "atomic-ghost")
