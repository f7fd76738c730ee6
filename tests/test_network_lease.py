"""A running task's ``text.delta`` stream (robot_lab/network/lease.py DeltaBuffer): chunks
are coalesced into windows, what is left goes out with the result, and a flush before any
other event keeps the stream in the order things happened."""

from __future__ import annotations

from typing import Any

import pytest

from robot_lab.network import lease as task_io
from robot_lab.network.lease import DeltaBuffer


class Store:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def emit(self, event: str, *, task: str, robot: str, data: Any = None) -> None:
        self.events.append((event, data))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(task_io.time, "monotonic", lambda: now[0])
    return now


def test_a_reply_inside_one_window_costs_no_event_of_its_own(clock: list[float]) -> None:
    store = Store()
    buffer = DeltaBuffer(store, "t", "bot", interval=0.05)  # type: ignore[arg-type]
    clock[0] += 5.0  # a long wait for the model before the first chunk
    for piece in ("Hel", "lo", ""):
        buffer.add(piece)
        clock[0] += 0.01
    assert store.events == []
    assert buffer.take() == [("text.delta", {"delta": "Hello"})]
    assert buffer.take() == []


def test_a_long_stream_goes_out_once_per_window(clock: list[float]) -> None:
    store = Store()
    buffer = DeltaBuffer(store, "t", "bot", interval=0.05)  # type: ignore[arg-type]
    for i in range(10):
        buffer.add(str(i))
        clock[0] += 0.02
    # the window opened by chunk 0 closes at chunk 3 (0.06 s on), the next one opens at
    # chunk 4 and closes at chunk 7; the rest goes with the result
    assert [data["delta"] for _, data in store.events] == ["0123", "4567"]
    assert buffer.take() == [("text.delta", {"delta": "89"})]


def test_flush_sends_what_is_gathered_before_another_event(clock: list[float]) -> None:
    store = Store()
    buffer = DeltaBuffer(store, "t", "bot")  # type: ignore[arg-type]
    buffer.add("thinking")
    buffer.flush()
    store.emit("tool_call.started", task="t", robot="bot", data={"name": "x"})
    buffer.flush()  # nothing new: no empty event
    assert store.events == [("text.delta", {"delta": "thinking"}), ("tool_call.started", {"name": "x"})]


def test_a_process_running_many_tasks_at_once_takes_longer_leases(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each of the lease keeper's GIL acquisitions can wait for every task in hand, so a
    process's leases (and holds) last at least SLOT_LEASE_MS per task it runs at once; the
    configured lease stays the floor. An in-flight worker says how many it runs."""
    from robot_lab.network import lease
    from robot_lab.workers.inflight import in_flight_worker_class

    monkeypatch.setattr(lease, "_process_slots", 1)
    monkeypatch.setenv("ROBOT_LAB_TASK_LEASE_MS", "5000")
    assert lease.task_lease_ms() == 5000
    lease.set_process_slots(5000)
    assert lease.task_lease_ms() == 5000 * lease.SLOT_LEASE_MS
    lease.set_process_slots(16)
    assert lease.task_lease_ms() == 5000

    import fakeredis
    from rq import Queue

    queue = Queue("slots", connection=fakeredis.FakeRedis())
    in_flight_worker_class()([queue], connection=queue.connection, in_flight=2000)
    assert lease.task_lease_ms() == 2000 * lease.SLOT_LEASE_MS
