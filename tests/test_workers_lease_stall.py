"""Leases and holds of a process that beats late last longer: the lease keeper measures how
late its rounds come, and every lease it writes or extends, and every lease and hold the
process makes (``task_lease_ms``), carries ``STALL_FACTOR`` times the worst recent lateness
on top, decaying back to the plain lease once the process keeps time again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from robot_lab.network import lease
from robot_lab.outage import OutageTracker
from tests.redis_server import wait_for


@pytest.fixture
def keeper(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A lease keeper of this test alone, standing in for the process's."""
    fresh = lease._LeaseKeeper()
    monkeypatch.setattr(lease, "_keeper", fresh)
    return fresh


def test_a_late_round_lengthens_every_lease_the_process_writes(real_client: Any, key_prefix: str,
                                                               keeper: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_TASK_LEASE_MS", "3000")
    assert lease.task_lease_ms() == 3000  # on time: the plain lease
    key = f"{key_prefix}:lease:t"
    real_client.set(key, "w", px=3000)
    beat = lease.LeaseHeartbeat.__new__(lease.LeaseHeartbeat)
    beat._setup(real_client, key, "w", "t", 3000, OutageTracker("test"))
    beat.next_beat = time.monotonic() - 2.0  # its beat was due 2 s ago: a starved keeper
    keeper.add(beat)
    wait_for(lambda: keeper.late >= 2.0, timeout=30)
    wait_for(lambda: beat.next_beat > time.monotonic() - 1.0, timeout=30)  # beaten once since
    # the beat extended it by its lease and 3 x the 2 s it came late
    assert real_client.pttl(key) > 3000 + 5000
    assert lease.task_lease_ms() >= 3000 + 5900  # a new lease or hold of this process too
    beat.stopped = True
    keeper.remove(beat)


def test_the_margin_decays_once_the_process_keeps_time(keeper: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_TASK_LEASE_MS", "5000")
    keeper.measured(2.0)
    assert keeper.stall_margin_ms() == pytest.approx(6000, abs=50)
    keeper.late_at -= lease.STALL_HALF_LIFE  # a half-life on, nothing later
    assert keeper.stall_margin_ms() == pytest.approx(3000, abs=50)
    keeper.measured(0.5)  # on time, or less late than the decayed worst: nothing changes
    assert keeper.stall_margin_ms() == pytest.approx(3000, abs=50)
    keeper.late_at -= 20 * lease.STALL_HALF_LIFE
    assert lease.task_lease_ms() == 5000


def test_a_job_off_its_queue_is_stranded_only_a_task_lease_after_a_sweep_first_saw_it(
        real_client: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved in-flight worker may take seconds from popping a job to writing its hold;
    the sweep takes such a job for stranded (and requeues it) only once two sweeps a task
    lease apart found it off its queue and unheld, not 2 s apart."""
    from rq import Queue

    from robot_lab.keys import Keys
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build
    from tests.worker_procs import uid

    monkeypatch.setenv("ROBOT_LAB_TASK_LEASE_MS", "5000")
    bot = build(f"stranded-{uid()}", model="scripted/echo")
    net = create_network(f"stranded-{uid()}")
    net.task("a", bot)
    coordinator = Coordinator(connection=real_client, keys=Keys(prefix=key_prefix))
    handle = coordinator.submit(net, "go")
    job = real_client.hget(handle.store.key + ":jobs", "a").decode()
    queue = Queue(f"robot:{bot.name}", connection=real_client)
    try:
        assert real_client.lrem(queue.key, 0, job) == 1  # popped by a worker ...
        real_client.rpush(f"{queue.key}:intermediate", job)  # ... that has not held it yet
        real_client.hset(handle.store.key + ":queued_at", "a", time.time() - 10)  # enqueued 10 s ago
        marker = f"{handle.store.key}:stranded:a"  # a sweep's first sighting, 60 s TTL
        real_client.set(marker, job, px=60_000 - 3_000)  # first seen off its queue 3 s ago
        assert coordinator.sweep_run(handle.run_id) == 0  # within a lease: the worker may be slow
        real_client.set(marker, job, px=60_000 - 6_000)  # 6 s ago: past the 5 s lease
        assert coordinator.sweep_run(handle.run_id) == 1  # stranded: requeued
    finally:
        real_client.delete(queue.key, f"{queue.key}:intermediate")
