"""A conversation must not stall when the consumer running its head dies.

The head of a conversation list that a survivor reclaims from a dead consumer runs on the
survivor, and the entries queued behind it follow in stream order; a head that nobody runs
for longer than the visibility timeout plus one reclaim sweep is a ``robot-lab status``
problem. In-process tests run on fakeredis and real Redis; the kill -9 tests use real
worker processes (tests/busproc.py) on a real Redis.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from robot_lab import settings
from robot_lab.bus import Bus, BusPoller
from robot_lab.bus.stalls import stalled_conversations, sweep_interval
from robot_lab.keys import Keys
from robot_lab.schemas import RobotMessage, decode_message
from robot_lab.workers.fleet_status import collect_status
from tests.redis_server import wait_for
from tests.test_bus_procs import VISIBILITY, env, procs, start_workers  # noqa: F401 - env, procs: fixtures

VIS = 0.2  # visibility timeout of the in-process tests


class Died(BaseException):
    """A consumer "dying" inside its handler: not an Exception, so no nack runs."""


@pytest.fixture
def bus(redis_client) -> Bus:  # type: ignore[no-untyped-def]
    b = Bus(redis_client)
    b.register("talk")
    return b


def poller(bus: Bus, consumer: str, **kw: Any) -> BusPoller:
    kw.setdefault("block_ms", 0)
    kw.setdefault("visibility_timeout", VIS)
    return BusPoller("talk", bus, consumer=consumer, **kw)


def drain(p: BusPoller, rounds: int = 50) -> None:
    for _ in range(rounds):
        if p.poll(block_ms=0) == 0 and not p.held:
            return


def idle_ms(bus: Bus, robot: str, entry: str) -> int:
    rows = bus.redis.xpending_range(bus.keys.inbox(robot), robot, min=entry, max=entry, count=1)
    return int(rows[0]["time_since_delivered"]) if rows else -1


def entry_of(bus: Bus, robot: str, message: RobotMessage) -> str:
    for entry_id, fields in bus.redis.xrange(bus.keys.inbox(robot)):
        if decode_message(fields[b"envelope"]).id == message.id:
            return entry_id.decode()
    raise AssertionError(f"message {message.id} not in the inbox")


def replies(bus: Bus, stream: str) -> dict[str, list[RobotMessage]]:
    """in_reply_to -> replies, in stream order."""
    out: dict[str, list[RobotMessage]] = defaultdict(list)
    for _, fields in bus.redis.xrange(bus.keys.inbox(stream)):
        reply = decode_message(fields[b"envelope"])
        out[reply.in_reply_to or ""].append(reply)
    return out


def test_reclaimed_head_runs_first_and_the_conversation_follows_in_order(bus: Bus) -> None:
    """A stalled conversation in one process: the survivor has read the rest of the
    conversation before it reclaims the head from the consumer that died running it."""
    def die(message: RobotMessage) -> None:
        raise Died()

    doomed = poller(bus, "doomed", batch_size=1).on_message(die)
    handled: list[Any] = []
    survivor = poller(bus, "survivor", claim_interval=3600).on_message(lambda m: handled.append(m.content))
    survivor.poll()
    head = bus.publish("talk", "0", conversation_id="c-1")
    with pytest.raises(Died):
        doomed.poll()  # read the head, acquired it, died in the handler
    for seq in range(1, 6):
        bus.publish("talk", str(seq), conversation_id="c-1")
    bus.publish("talk", "free")
    survivor.poll()
    assert handled == ["free"] and survivor.held == 5  # the rest waits for the head
    head_entry = entry_of(bus, "talk", head)
    wait_for(lambda: survivor.poll() == 0 and idle_ms(bus, "talk", head_entry) >= VIS * 1000)
    survivor.claim_interval = 0  # one reclaim sweep, then none
    survivor.poll()
    survivor.claim_interval = 3600
    drain(survivor)
    assert handled == ["free", "0", "1", "2", "3", "4", "5"]
    assert survivor.counts["reclaimed"] == 1 and survivor.held == 0
    assert bus.redis.xpending(bus.keys.inbox("talk"), "talk")["pending"] == 0
    assert not bus.redis.exists(bus.keys.conversation_queue("talk"))
    assert not bus.redis.exists(bus.keys.conversation_heads("talk"))


def test_a_head_reclaimed_by_someone_else_does_not_run_on_its_old_consumer(bus: Bus) -> None:
    handled: list[tuple[str, Any]] = []
    slow = poller(bus, "slow", claim_interval=3600).on_message(lambda m: handled.append(("slow", m.content)))
    fast = poller(bus, "fast", claim_interval=3600).on_message(lambda m: handled.append(("fast", m.content)))
    slow.poll()
    bus.publish("talk", "0", conversation_id="c-1")
    slow._read()  # holds the head without running it, and then stops beating it
    entry = bus.redis.xrange(bus.keys.inbox("talk"))[0][0].decode()
    wait_for(lambda: idle_ms(bus, "talk", entry) >= VIS * 1000)
    fast.claim_interval = 0
    fast.poll()  # reclaims and runs it
    assert handled == [("fast", "0")]
    slow.poll()  # the old holder learns it lost the entry and does not run it again
    assert handled == [("fast", "0")] and slow.held == 0


def test_status_reports_a_head_nobody_runs_but_not_a_long_handler(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    vis = 0.5
    monkeypatch.setenv("ROBOT_LAB_BUS__VISIBILITY_TIMEOUT", str(vis))  # what status reads
    monkeypatch.setattr(settings, "_settings", None)

    def die(message: RobotMessage) -> None:
        raise Died()

    gate, started = threading.Event(), threading.Event()

    def long_handler(message: RobotMessage) -> None:
        started.set()
        gate.wait(30)

    holder = poller(bus, "holder", claim_interval=3600, visibility_timeout=vis)
    dead = poller(bus, "dead", batch_size=1, claim_interval=3600, visibility_timeout=vis).on_message(die)
    runner = poller(bus, "runner", claim_interval=3600, batch_size=1, block_ms=20,
                    visibility_timeout=vis).on_message(long_handler)
    holder.poll(), dead.poll()  # registered; their one sweep at start is behind them
    # c-held: read and heart-beaten by a consumer that never runs it (a stalled head)
    bus.publish("talk", "held", conversation_id="c-held")
    holder._read()
    # c-dead: granted to a consumer that then stopped heart-beating (killed mid-handler)
    bus.publish("talk", "dies", conversation_id="c-dead")
    with pytest.raises(Died):
        dead.poll()
    # c-long: its handler runs longer than the threshold in a live, heart-beating consumer
    bus.publish("talk", "long", conversation_id="c-long")
    runner.start()
    try:
        assert started.wait(60)
        assert stalled_conversations(bus, "talk", visibility_timeout=60) == []  # not for that long
        end = time.monotonic() + vis + sweep_interval(vis) + 0.1
        while time.monotonic() < end:
            holder._heartbeat()
            time.sleep(0.02)
        stalled_now = lambda: {s.conversation: s for s in stalled_conversations(bus, "talk", visibility_timeout=vis)}  # noqa: E731
        wait_for(lambda: set(stalled_now()) == {"c-held", "c-dead"})
        stalled = stalled_now()
        assert stalled["c-held"].consumer == "holder" and stalled["c-held"].runner == ""
        assert stalled["c-dead"].runner == "dead" and stalled["c-dead"].idle_s >= vis
        problems = collect_status(bus.redis, bus.keys, robots=["talk"])["problems"]
        assert any("conversation 'c-held' stalled" in p and "not running" in p for p in problems), problems
        assert any("conversation 'c-dead' stalled" in p and "stopped heart-beating" in p for p in problems)
        assert not any("c-long" in p for p in problems)
    finally:
        gate.set()
        runner.stop()
    drain(holder)  # runs its head: no longer a problem
    assert "c-held" not in {s.conversation for s in stalled_conversations(bus, "talk", visibility_timeout=vis)}


# --- kill -9 of a real worker process running the head ------------------------------------

def _head_held_by_a_hanging_worker(bus: Bus, child_env: dict[str, str], started: list, tmp_path: Any) -> RobotMessage:  # type: ignore[type-arg]
    """Publish the head of c-1 and let a real worker process (reading one entry at a time)
    take it and hang in its handler; returns the head."""
    bus.register("talk")
    head = bus.publish("talk", {"seq": 0}, conversation_id="c-1", from_="client", reply_to="client")
    start_workers(started, dict(child_env, ROBOT_LAB_BUS__BATCH_SIZE="1"), tmp_path, "slow", "talk", "doomed")
    test = f"{bus.keys.prefix}:test"
    wait_for(lambda: bus.redis.lrange(f"{test}:started", 0, -1) == [head.id.encode()], timeout=30)
    return head


def _publish_rest(bus: Bus) -> list[RobotMessage]:
    rest = [bus.publish("talk", {"seq": i}, conversation_id="c-1", from_="client", reply_to="client") for i in range(1, 10)]
    for i in range(3):
        bus.publish("talk", {"seq": i}, conversation_id="c-2", from_="client", reply_to="client")
    return rest


def _assert_answered_once_in_order(bus: Bus, conversation: list[RobotMessage]) -> None:
    got = replies(bus, "client")
    for message in conversation:
        assert len({r.id for r in got[message.id]}) == 1, f"message {message.content} answered {got[message.id]}"
    in_stream_order = [r.in_reply_to for _, f in bus.redis.xrange(bus.keys.inbox("client"))
                       for r in [decode_message(f[b"envelope"])] if r.conversation_id == "c-1"]
    first_seen = list(dict.fromkeys(in_stream_order))
    assert first_seen == [m.id for m in conversation]
    assert [got[m.id][0].content for m in conversation] == [f"re: {i}" for i in range(len(conversation))]


@pytest.mark.slow
def test_kill_9_of_the_head_holder_survivor_runs_the_conversation_after_one_sweep(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    bus = Bus()
    head = _head_held_by_a_hanging_worker(bus, env, procs, tmp_path)
    order: list[tuple[str, int]] = []

    def answer(message: RobotMessage) -> str:
        order.append((message.conversation_id or "", message.content["seq"]))  # type: ignore[index]
        return f"re: {message.content['seq']}"  # type: ignore[index]

    survivor = BusPoller("talk", bus, consumer="survivor", block_ms=0, claim_interval=3600)
    survivor.respond_to_tasks(answer)
    survivor.poll()
    rest = _publish_rest(bus)
    drain_rounds = 0
    while survivor.held < 9 and drain_rounds < 50:
        survivor.poll()
        drain_rounds += 1
    assert order == [("c-2", 0), ("c-2", 1), ("c-2", 2)] and survivor.held == 9  # c-1 waits for its head
    doomed = procs[0]
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    head_entry = entry_of(bus, "talk", head)
    # the lease of the dead consumer runs out (the survivor keeps beating its own entries)
    wait_for(lambda: survivor.poll() == 0 and idle_ms(bus, "talk", head_entry) >= VISIBILITY * 1000, timeout=30)
    survivor.claim_interval = 0  # exactly one reclaim sweep ...
    survivor.poll()
    survivor.claim_interval = 3600  # ... and no more
    drain(survivor)
    assert order[3:] == [("c-1", i) for i in range(10)]
    assert survivor.counts["reclaimed"] == 1
    _assert_answered_once_in_order(bus, [head, *rest])
    assert bus.redis.xpending(bus.keys.inbox("talk"), "talk")["pending"] == 0
    assert stalled_conversations(bus, "talk", visibility_timeout=VISIBILITY) == []


@pytest.mark.slow
def test_kill_9_of_the_head_holder_with_a_real_survivor_process(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    bus = Bus()
    head = _head_held_by_a_hanging_worker(bus, env, procs, tmp_path)
    start_workers(procs, env, tmp_path, "convecho", "talk", "survivor")
    rest = _publish_rest(bus)
    inbox, test = bus.keys.inbox("talk"), f"{bus.keys.prefix}:test"
    # the survivor holds the rest of c-1 (read, waiting for the head) and answered c-2
    wait_for(lambda: len(bus.redis.xpending_range(inbox, "talk", "-", "+", 100, consumername="survivor")) == 9
             and bus.redis.llen(f"{test}:order:c-2") == 3, timeout=30)
    assert bus.redis.llen(f"{test}:order:c-1") == 0
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].wait(10)
    wait_for(lambda: bus.redis.llen(f"{test}:order:c-1") == 10, timeout=30)
    assert [x.decode() for x in bus.redis.lrange(f"{test}:order:c-1", 0, -1)] == [f"survivor:{i}" for i in range(10)]
    wait_for(lambda: bus.redis.xpending(inbox, "talk")["pending"] == 0)
    _assert_answered_once_in_order(bus, [head, *rest])
    assert Keys(bus.keys.prefix).conversation_heads("talk") == bus.keys.conversation_heads("talk")
    assert not bus.redis.exists(bus.keys.conversation_heads("talk"))
