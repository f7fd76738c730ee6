"""BusPoller with ``in_flight > 1``: handlers of different conversations run at once on the
poller's threads, one conversation stays in order and never overlaps across consumers, reads
are capped by the free slots, and a stop lets the handlers in hand finish. On fakeredis and
real Redis (the ``redis_client`` fixture)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from robot_lab.bus import Bus, BusPoller
from tests.redis_server import wait_for


@pytest.fixture
def bus(redis_client) -> Bus:  # type: ignore[no-untyped-def]
    return Bus(redis_client)


def poller(bus: Bus, consumer: str, in_flight: int, **kw: Any) -> BusPoller:
    return BusPoller("billing", bus, consumer=consumer, in_flight=in_flight, block_ms=50, retry_delay=0, **kw)


def pending(bus: Bus, consumer: str | None = None) -> int:
    return len(bus.redis.xpending_range(bus.keys.inbox("billing"), "billing", "-", "+", 1000,
                                        consumername=consumer))


def test_different_conversations_run_at_once(bus: Bus) -> None:
    bus.register("billing")
    # the first message of each of 4 conversations waits until all 4 are running: only a
    # poller running 4 handlers at once gets past the barrier
    barrier = threading.Barrier(4, timeout=20)
    done: list[str] = []
    lock = threading.Lock()

    def handle(msg: Any) -> None:
        if msg.content["seq"] == 0:
            barrier.wait()
        with lock:
            done.append(f"{msg.conversation_id}:{msg.content['seq']}")

    p = poller(bus, "c1", 4).on_message(handle)
    for seq in range(2):
        for conv in range(4):
            bus.publish("billing", {"seq": seq}, conversation_id=f"conv{conv}")
    with p:
        wait_for(lambda: len(done) == 8, timeout=30)
    assert not barrier.broken
    for conv in range(4):
        assert [d for d in done if d.startswith(f"conv{conv}:")] == [f"conv{conv}:0", f"conv{conv}:1"]
    assert pending(bus) == 0


def test_each_conversation_in_order_and_alone_across_consumers(bus: Bus) -> None:
    bus.register("billing")
    order: dict[str, list[int]] = {}
    running: dict[str, str] = {}
    overlaps: list[str] = []
    by: dict[str, int] = {}
    lock = threading.Lock()
    stop_evt = threading.Event()

    def make(consumer: str):  # type: ignore[no-untyped-def]
        def handle(msg: Any) -> None:
            conv = msg.conversation_id
            with lock:
                if conv in running:
                    overlaps.append(f"{conv}: {running[conv]} and {consumer}")
                running[conv] = consumer
            stop_evt.wait(0.002 * (msg.content["seq"] % 3))
            with lock:
                order.setdefault(conv, []).append(msg.content["seq"])
                by[consumer] = by.get(consumer, 0) + 1
                running.pop(conv, None)
        return handle

    pollers = [poller(bus, f"c{i}", 4).on_message(make(f"c{i}")) for i in range(2)]
    for seq in range(6):
        for conv in range(6):
            bus.publish("billing", {"seq": seq}, conversation_id=f"conv{conv}")
    for p in pollers:
        p.start()
    try:
        wait_for(lambda: sum(len(v) for v in order.values()) == 36, timeout=60)
    finally:
        for p in pollers:
            p.stop()
    assert overlaps == []
    assert order == {f"conv{c}": list(range(6)) for c in range(6)}
    assert pending(bus) == 0


def test_reads_no_more_than_its_free_slots(bus: Bus) -> None:
    bus.register("billing")
    release = threading.Event()
    started: list[str] = []

    def handle(msg: Any) -> None:
        started.append(msg.id)
        release.wait(20)

    p = poller(bus, "c1", 2).on_message(handle)
    for i in range(6):
        bus.publish("billing", f"m{i}")
    with p:
        wait_for(lambda: len(started) == 2)
        # two handlers run; the other entries stay in the stream for any consumer
        assert pending(bus, "c1") == 2 and p.held == 2
        release.set()
        wait_for(lambda: len(started) == 6 and pending(bus) == 0)


def test_stop_lets_handlers_in_hand_finish(bus: Bus) -> None:
    bus.register("billing")
    release = threading.Event()
    started: list[str] = []
    finished: list[str] = []

    def handle(msg: Any) -> None:
        started.append(msg.id)
        release.wait(20)
        finished.append(msg.id)

    p = poller(bus, "c1", 3).on_message(handle)
    for i in range(5):
        bus.publish("billing", f"m{i}")
    p.start()
    wait_for(lambda: len(started) == 3)
    stopper = threading.Thread(target=p.stop, kwargs={"timeout": 30})
    stopper.start()
    wait_for(lambda: p._stop_event.is_set())
    release.set()  # the handlers in hand finish after the stop was asked for
    stopper.join(30)
    assert sorted(finished) == sorted(started) and len(finished) == 3
    assert pending(bus) == 0  # acked; nothing held was left behind
    rest: list[str] = []
    with poller(bus, "c2", 3).on_message(lambda m: rest.append(m.id)):
        wait_for(lambda: len(rest) == 2)
    assert not set(rest) & set(finished)


class OneAtATime:
    """A robot-like object that is not safe for concurrent runs: it records overlaps."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.lock = threading.Lock()

    def run(self, text: str, conversation_id: str | None = None) -> str:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        threading.Event().wait(0.01)
        with self.lock:
            self.active -= 1
        return f"re: {text}"


def test_serve_runs_a_plain_robot_object_one_message_at_a_time(bus: Bus) -> None:
    bus.register("billing")
    bus.register("client")
    robot = OneAtATime()
    p = poller(bus, "c1", 4).serve(robot)
    for i in range(6):
        bus.publish("billing", f"q{i}", from_="client", conversation_id=f"conv{i}")
    with p:
        wait_for(lambda: bus.redis.xlen(bus.keys.inbox("client")) == 6, timeout=30)
    assert robot.most == 1


class Gate:
    """A robot-like object whose runs wait for each other: only concurrent runs pass."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier
        self.conversations: list[str | None] = []

    def run(self, text: str, conversation_id: str | None = None, attachments: Any = None, **kw: Any) -> str:
        self.conversations.append(conversation_id)
        self.barrier.wait()
        return f"re: {text}"

    def serve_policy(self, headers: Any = None) -> dict[str, Any]:
        return {}


def test_serve_a_robot_pool_runs_each_message_on_a_robot_of_its_own(bus: Bus) -> None:
    from robot_lab.workers import RobotPool

    bus.register("billing")
    bus.register("client")
    barrier = threading.Barrier(3, timeout=20)
    robots: list[Gate] = []

    def build() -> Gate:
        robots.append(Gate(barrier))
        return robots[-1]

    pool = RobotPool(spec=None, build=build)
    p = poller(bus, "c1", 3).serve(pool)
    for i in range(3):
        bus.publish("billing", f"q{i}", from_="client", conversation_id=f"conv{i}")
    with p:
        wait_for(lambda: bus.redis.xlen(bus.keys.inbox("client")) == 3, timeout=30)
    assert not barrier.broken and pool.built == 3  # three robots ran at once, one message each
    assert sorted(c for r in robots for c in r.conversations) == ["conv0", "conv1", "conv2"]


def test_a_handler_stuck_on_the_pool_fails_the_loops_health(bus: Bus) -> None:
    from robot_lab.workers.supervision import Loop, supervise_poller

    bus.register("billing")
    release = threading.Event()
    p = poller(bus, "c1", 2).on_message(lambda msg: release.wait(20))
    loop = Loop("bus-billing", idle_limit=60)
    stop = threading.Event()
    supervise_poller(p, loop, stop, handler_limit=0.2)
    bus.publish("billing", "hang")
    with p:
        wait_for(lambda: loop.problem() and "stuck: a handler running" in loop.problem())
        release.set()
        wait_for(lambda: pending(bus) == 0)
    assert p.longest_running() == 0.0
