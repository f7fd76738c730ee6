"""As a property: consumers that die between any two Redis calls never lose,
reorder or double-answer anything, and the survivors finish everything with one reclaim
sweep once the dead consumers' leases (the visibility timeout) have run out.

Each consumer talks to a real Redis through its own client whose connection raises
``Crash`` (a BaseException, so nothing in the poller can catch it) instead of sending its
N-th command: the consumer is dead from that moment, exactly as if its process had been
killed between two Redis calls, and is never used again. Hypothesis draws the messages
(several conversations and some free entries), each consumer's crash point and the
interleaving: which consumer polls next, publishes, reclaim sweeps and pauses that let
leases run out under live consumers too. ``ROBOT_LAB_PROPERTY_EXAMPLES`` sets how many
scenarios to try (40 by default).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_lab.bus import Bus, BusPoller
from robot_lab.keys import Keys
from robot_lab.schemas import RobotMessage, decode_message
from robot_lab.settings import BusSettings

VIS = 0.15  # visibility timeout (s)
ROBOT = "talk"


class Crash(BaseException):
    """The consumer died here."""


class CallBudget:
    """Redis commands a consumer may still send; ``None``: it never dies."""

    def __init__(self, calls: int | None) -> None:
        self.left = calls
        self.dead = False

    def spend(self) -> None:
        if self.left is None:
            return
        if self.left <= 0:
            self.dead = True
            raise Crash()
        self.left -= 1


def crashing_client(url: str, budget: CallBudget) -> redis.Redis:
    class Connection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            budget.spend()  # before sending: the command never reaches Redis
            super().send_packed_command(command, check_health)

    return redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, connection_class=Connection))


@dataclass
class Consumer:
    name: str
    budget: CallBudget
    poller: BusPoller
    client: redis.Redis

    @property
    def alive(self) -> bool:
        return not self.budget.dead

    def step(self, sweep: bool = False) -> None:
        if not self.alive:
            return
        if sweep:
            self.poller.claim_interval = 0
        try:
            self.poller.poll(max_messages=1, block_ms=0)
        except Crash:
            pass
        finally:
            self.poller.claim_interval = 3600


@dataclass
class World:
    url: str
    keys: Keys
    calls: list[tuple[str, str, int]] = field(default_factory=list)  # (message id, conversation, seq)
    consumers: list[Consumer] = field(default_factory=list)

    def bus(self, client: redis.Redis) -> Bus:
        cfg = BusSettings(visibility_timeout=VIS, batch_size=2, max_deliveries=50, retry_delay=0)
        return Bus(client, keys=self.keys, settings=cfg)

    def add_consumer(self, crash_after: int | None) -> None:
        budget = CallBudget(crash_after)
        client = crashing_client(self.url, budget)
        name = f"c{len(self.consumers)}"
        poller = BusPoller(ROBOT, self.bus(client), consumer=name, block_ms=0, claim_interval=3600)

        def answer(message: RobotMessage) -> str:
            content = message.content
            assert isinstance(content, dict)
            self.calls.append((message.id, message.conversation_id or "", int(content["seq"])))
            return f"re: {message.conversation_id}:{content['seq']}"

        poller.respond_to_tasks(answer)
        self.consumers.append(Consumer(name, budget, poller, client))


# (label, seq) in publish order: a permutation of the conversations' entries, seq in order
def _messages(labels: list[str]) -> list[tuple[str, int]]:
    seen: dict[str, int] = defaultdict(int)
    out = []
    for label in labels:
        out.append((label, seen[label]))
        seen[label] += 1
    return out


scenarios = st.fixed_dictionaries({
    "labels": st.lists(st.integers(1, 5), min_size=1, max_size=3).flatmap(
        lambda sizes: st.integers(0, 3).flatmap(
            lambda free: st.permutations(
                [f"conv-{i}" for i, n in enumerate(sizes) for _ in range(n)] + ["free"] * free
            )
        )
    ),
    # consumer 0 never dies; the others die after their N-th Redis command (or never)
    "crashes": st.lists(st.one_of(st.none(), st.integers(0, 70)), min_size=1, max_size=3),
    "schedule": st.lists(
        st.one_of(
            st.tuples(st.just("poll"), st.integers(0, 3)),
            st.tuples(st.just("sweep"), st.integers(0, 3)),
            st.tuples(st.just("publish"), st.just(0)),
            st.tuples(st.just("pause"), st.just(0)),
        ),
        max_size=60,
    ),
})


@pytest.fixture
def redis_url(real_redis_url: str) -> str:
    return real_redis_url


@settings(max_examples=int(os.environ.get("ROBOT_LAB_PROPERTY_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenario=scenarios)
def test_crashes_between_any_two_redis_calls_lose_and_reorder_nothing(redis_url: str, scenario: dict[str, Any]) -> None:
    prefix = f"rlprop-{uuid.uuid4().hex[:10]}"
    world = World(redis_url, Keys(prefix))
    admin = redis.Redis.from_url(redis_url)
    try:
        _run(world, admin, scenario)
    finally:
        for c in world.consumers:
            c.client.connection_pool.disconnect()
        keys = list(admin.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            admin.delete(*keys)
        admin.close()


def _run(world: World, admin: redis.Redis, scenario: dict[str, Any]) -> None:
    publisher = world.bus(admin)
    publisher.register(ROBOT)
    world.add_consumer(None)
    for crash_after in scenario["crashes"]:
        world.add_consumer(crash_after)
    to_publish = _messages(scenario["labels"])
    sent: list[RobotMessage] = []

    def publish_next() -> None:
        if len(sent) < len(to_publish):
            label, seq = to_publish[len(sent)]
            conv = None if label == "free" else label
            sent.append(publisher.publish(ROBOT, {"seq": seq}, conversation_id=conv, from_="client", reply_to="client"))

    pauses = 0
    for action, index in scenario["schedule"]:
        if action == "publish":
            publish_next()
        elif action == "pause" and pauses < 2:  # leases run out under live consumers too
            pauses += 1
            time.sleep(VIS)
        elif action in ("poll", "sweep"):
            world.consumers[index % len(world.consumers)].step(sweep=action == "sweep")
    while len(sent) < len(to_publish):
        publish_next()

    # The chaos ends: a consumer that was going to die and has not yet is killed now
    # (between two of its Redis calls); consumers drawn to never die survive.
    for c in world.consumers:
        if c.budget.left is not None:
            c.budget.left, c.budget.dead = 0, True
    survivors = [c for c in world.consumers if c.alive]
    dead = {c.name for c in world.consumers if not c.alive}
    inbox = world.keys.inbox(ROBOT)

    def pending_rows() -> list[dict[str, Any]]:
        return admin.xpending_range(inbox, ROBOT, "-", "+", 10_000)

    def unfinished() -> bool:
        [group] = admin.xinfo_groups(inbox)
        return bool(group["pending"] or group["lag"] or any(c.poller.held for c in survivors))

    # (the deadlines below only stop a hang; nothing is asserted about time)
    # 1. survivors keep working (no sweeps) until every entry a dead consumer holds is idle
    #    past the visibility timeout: their leases have run out
    deadline = time.monotonic() + 10
    while any(r["consumer"].decode() in dead and r["time_since_delivered"] < VIS * 1000 for r in pending_rows()):
        for c in survivors:
            c.step()
        assert time.monotonic() < deadline, "dead consumers' entries never went idle"
    # 2. one reclaim sweep each
    for c in survivors:
        c.step(sweep=True)
    # 3. no more sweeps: the survivors must finish everything
    deadline = time.monotonic() + 10
    while unfinished():
        for c in survivors:
            c.step()
        assert time.monotonic() < deadline, f"unfinished after one sweep: {pending_rows()}"

    # nothing pending, nothing dead-lettered, no ordering state left behind
    assert admin.xpending(inbox, ROBOT)["pending"] == 0
    assert admin.xlen(world.keys.dlq(ROBOT)) == 0
    assert not admin.exists(world.keys.conversation_queue(ROBOT))
    assert not admin.exists(world.keys.conversation_heads(ROBOT))

    # every entry handled at least once
    by_id = {m.id: m for m in sent}
    assert {mid for mid, _, _ in world.calls} == set(by_id)
    # order per conversation: no entry ran after a later entry of its conversation
    per_conv: dict[str, list[int]] = defaultdict(list)
    for _, conv, seq in world.calls:
        if conv:
            per_conv[conv].append(seq)
    for conv, seqs in per_conv.items():
        assert seqs == sorted(seqs), f"{conv} ran out of order: {seqs}"
    # each message answered with exactly one reply (a redelivery re-sends that same reply)
    replies: dict[str, set[tuple[str, str]]] = defaultdict(set)
    first_reply_order: dict[str, list[int]] = defaultdict(list)
    for _, fields in admin.xrange(world.keys.inbox("client")):
        reply = decode_message(fields[b"envelope"])
        original = by_id[reply.in_reply_to or ""]
        if not replies[original.id] and original.conversation_id:
            first_reply_order[original.conversation_id].append(original.content["seq"])  # type: ignore[index]
        replies[original.id].add((reply.id, str(reply.content)))
    for message in sent:
        assert replies[message.id] and len(replies[message.id]) == 1, (message, replies[message.id])
        [(_, content)] = replies[message.id]
        assert content == f"re: {message.conversation_id}:{message.content['seq']}"  # type: ignore[index]
    for conv, seqs in first_reply_order.items():
        assert seqs == sorted(seqs), f"{conv} answered out of order: {seqs}"
