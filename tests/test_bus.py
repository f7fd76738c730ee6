"""The bus in one process: publish, BusPoller handler styles, ack/nack, dead letters,
replies, requests, conversations, recovery. Every test runs on fakeredis and real Redis."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

import pytest
import redis as redis_lib

from robot_lab.bus import Bus, BusPoller, Delivery
from robot_lab.bus.stalls import queue_entry
from robot_lab.errors import AwaitTimeout, BusError
from robot_lab.schemas import RobotMessage, RobotResult, TextMessage, decode_message, encode_message
from tests.redis_server import wait_for


@pytest.fixture
def bus(redis_client) -> Bus:  # type: ignore[no-untyped-def]
    return Bus(redis_client)


def make_poller(bus: Bus, robot: str = "billing", **kw: Any) -> BusPoller:
    kw.setdefault("block_ms", 0)
    kw.setdefault("retry_delay", 0)
    kw.setdefault("consumer", "c1")
    return BusPoller(robot, bus, **kw)


def drain(*pollers: BusPoller, rounds: int = 50) -> int:
    """Poll until a full round resolves nothing; returns the total resolved."""
    total = 0
    for _ in range(rounds):
        n = sum(p.poll(block_ms=0) for p in pollers)
        total += n
        if n == 0 and not any(p.held for p in pollers):
            return total
    return total


def pending(bus: Bus, robot: str, consumer: str | None = None) -> int:
    rows = bus.redis.xpending_range(bus.keys.inbox(robot), robot, "-", "+", 1000, consumername=consumer)
    return len(rows)


# --- publishing ------------------------------------------------------------------------

def test_publish_to_unregistered_robot_raises_unless_create(bus: Bus) -> None:
    with pytest.raises(BusError, match="Unknown channel: 'nobody'"):
        bus.publish("nobody", "hi")
    assert not bus.exists("nobody")
    msg = bus.publish("nobody", "hi", create=True)
    assert bus.exists("nobody") and "nobody" in bus.robots()
    groups = bus.redis.xinfo_groups(bus.keys.inbox("nobody"))
    assert [g["name"] for g in groups] == [b"nobody"]
    assert msg.to == "nobody" and msg.from_ == "anonymous"


def test_entry_is_one_envelope_field_with_the_message_json(bus: Bus) -> None:
    bus.register("billing")
    deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)
    msg = bus.publish("billing", {"invoice": 42}, from_="frontdesk", reply_to="frontdesk",
                      conversation_id="conv-1", headers={"traceparent": "00-abc-def-01"}, deadline=deadline)
    [(entry_id, fields)] = bus.redis.xrange(bus.keys.inbox("billing"))
    assert list(fields) == [b"envelope"]
    doc = json.loads(fields[b"envelope"])
    assert doc["from"] == "frontdesk" and doc["to"] == "billing" and doc["content"] == {"invoice": 42}
    assert doc["conversation_id"] == "conv-1" and doc["headers"] == {"traceparent": "00-abc-def-01"}
    assert decode_message(fields[b"envelope"]) == msg
    assert bus.keys.inbox("billing") == f"{bus.keys.prefix}:bus:billing"


@pytest.mark.parametrize("name", ["", "a:b", "x{y}", "has space", "a" * 201])
def test_bad_robot_names_are_refused_with_the_name(bus: Bus, name: str) -> None:
    with pytest.raises(BusError, match="invalid recipient name"):
        bus.publish(name, "hi", create=True)


def test_bad_content_and_naive_deadline_are_refused(bus: Bus) -> None:
    bus.register("billing")
    with pytest.raises(BusError, match="content must be"):
        bus.publish("billing", 42)  # type: ignore[arg-type]
    with pytest.raises(BusError, match="timezone-aware"):
        bus.publish("billing", "x", deadline=dt.datetime(2030, 1, 1))
    assert bus.redis.xlen(bus.keys.inbox("billing")) == 0


def test_trimming_never_drops_undelivered_or_pending_entries(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_BUS__MAXLEN", "5")
    bus = Bus(redis_client)
    assert bus.settings.maxlen == 5
    bus.register("billing")
    inbox = bus.keys.inbox("billing")
    first = [bus.publish("billing", f"m{i}") for i in range(3)]
    bus.redis.xreadgroup("billing", "holder", {inbox: ">"}, count=3)  # 3 pending, never acked
    for i in range(20):
        bus.publish("billing", f"n{i}")
    assert bus.redis.xlen(inbox) == 23  # nothing delivered-and-done to trim
    seen: list[str] = []
    poller = make_poller(bus).on_message(lambda m: seen.append(m.content))
    drain(poller)
    assert len(seen) == 20  # the undelivered ones all arrived
    for i in range(10):
        bus.publish("billing", f"p{i}")
    # the three pending ones (held by "holder") are still there: the floor stops the trim
    ids = {decode_message(f[b"envelope"]).id for _, f in bus.redis.xrange(inbox)}
    assert {m.id for m in first} <= ids
    bus.redis.xack(inbox, "billing", *[i for i, _ in bus.redis.xrange(inbox, count=3)])
    drain(poller)
    later = [bus.publish("billing", f"q{i}") for i in range(10)]
    ids = {decode_message(f[b"envelope"]).id for _, f in bus.redis.xrange(inbox)}
    assert {m.id for m in later} <= ids  # not yet delivered: kept beyond maxlen
    drain(poller)
    bus.publish("billing", "r1")
    bus.publish("billing", "r2")
    assert bus.redis.xlen(inbox) <= 5 + 1  # everything done: back to ~maxlen


# --- handler styles --------------------------------------------------------------------

def test_on_message_acks_only_after_the_handler_succeeds(bus: Bus) -> None:
    poller = make_poller(bus)
    observed: list[int] = []

    def handler(msg: RobotMessage) -> None:
        observed.append(pending(bus, "billing"))  # still pending while the handler runs

    poller.on_message(handler)
    poller.poll()
    bus.publish("billing", "one")
    assert poller.poll() == 1
    assert observed == [1]
    assert pending(bus, "billing") == 0 and poller.counts["acked"] == 1


def test_default_handler_is_a_noop_that_acks(bus: Bus) -> None:
    poller = make_poller(bus)
    poller.poll()
    bus.publish("billing", "ignored")
    assert poller.poll() == 1 and pending(bus, "billing") == 0


def test_manual_ack_and_nack_with_two_argument_handler(bus: Bus) -> None:
    poller = make_poller(bus)
    calls: list[tuple[str, int]] = []

    def handler(delivery: Delivery, msg: RobotMessage) -> None:
        calls.append((msg.content, delivery.deliveries))  # type: ignore[arg-type]
        if msg.content == "retry-once" and delivery.deliveries == 1:
            delivery.nack("not yet")
        elif msg.content == "reject":
            delivery.nack("bad request", requeue=False)
        else:
            delivery.ack()
            with pytest.raises(BusError, match="already acked"):
                delivery.ack()

    poller.on_message(handler)
    poller.poll()
    bus.publish("billing", "retry-once")
    bus.publish("billing", "reject")
    bus.publish("billing", "fine")
    drain(poller)
    assert calls == [("retry-once", 1), ("reject", 1), ("fine", 1), ("retry-once", 2)]
    [letter] = bus.dead_letters("billing")
    assert letter.reason == "rejected" and letter.error == "bad request" and letter.deliveries == 1
    assert pending(bus, "billing") == 0


def test_manual_handler_that_forgets_to_resolve_is_retried(bus: Bus) -> None:
    poller = make_poller(bus, max_deliveries=2)
    seen: list[int] = []
    poller.on_message(lambda d, m: seen.append(d.deliveries))
    poller.poll()
    bus.publish("billing", "x")
    drain(poller)
    assert seen == [1, 2]
    [letter] = bus.dead_letters("billing")
    assert "without ack or nack" in letter.error


# --- dead letters ----------------------------------------------------------------------

def test_poison_message_dead_lettered_after_n_deliveries_and_worker_goes_on(bus: Bus) -> None:
    poller = make_poller(bus, max_deliveries=3)
    handled: list[str] = []
    attempts: list[int] = []

    def handler(msg: RobotMessage) -> None:
        if msg.content == "poison":
            attempts.append(1)
            raise ValueError("cannot digest")
        handled.append(msg.content)  # type: ignore[arg-type]

    poller.on_message(handler)
    poller.poll()
    poison = bus.publish("billing", "poison")
    bus.publish("billing", "after-1")
    bus.publish("billing", "after-2")
    drain(poller)
    assert len(attempts) == 3
    assert handled == ["after-1", "after-2"]
    [letter] = bus.dead_letters("billing")
    assert letter.reason == "failed" and letter.deliveries == 3
    assert letter.error == "ValueError: cannot digest"
    assert letter.message_id == poison.id and letter.message() == poison
    assert pending(bus, "billing") == 0


@pytest.mark.parametrize(
    "fields, error_part",
    [
        ({"envelope": "this is not json"}, "JSON is malformed"),
        ({"envelope": json.dumps({"to": "billing", "content": 5})}, "$.content"),
        ({"envelope": json.dumps({"content": "no recipient"})}, "$.to"),
        ({"envelope": json.dumps(["a", "list"])}, "expected a JSON object"),
        ({"envelope": json.dumps({"to": "billing", "content": "x", "headers": {"a": 1}})}, "$.headers"),
        ({"body": "wrong field"}, "no 'envelope' field"),
    ],
)
def test_malformed_entry_goes_to_dlq_at_once_and_next_is_served(bus: Bus, fields: dict, error_part: str) -> None:  # type: ignore[type-arg]
    poller = make_poller(bus)
    handled: list[str] = []
    poller.on_message(lambda m: handled.append(m.content))
    poller.poll()
    bus.redis.xadd(bus.keys.inbox("billing"), fields)
    bus.publish("billing", "good")
    drain(poller)
    assert handled == ["good"]
    [letter] = bus.dead_letters("billing")
    assert letter.reason == "invalid" and letter.deliveries == 1
    assert error_part in letter.error
    if "envelope" in fields:
        assert letter.envelope == fields["envelope"]
    assert pending(bus, "billing") == 0


def test_expired_message_goes_to_dlq_with_reason_expired(bus: Bus) -> None:
    poller = make_poller(bus)
    handled: list[str] = []
    poller.on_message(lambda m: handled.append(m.content))
    poller.poll()
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    bus.publish("billing", "too late", deadline=past)
    bus.publish("billing", "in time", deadline=60)
    drain(poller)
    assert handled == ["in time"]
    [letter] = bus.dead_letters("billing")
    assert letter.reason == "expired" and "deadline" in letter.error


def test_dlq_replay_and_purge(bus: Bus) -> None:
    poller = make_poller(bus)
    fail = {"on": True}
    handled: list[str] = []

    def handler(msg: RobotMessage) -> None:
        if fail["on"]:
            raise RuntimeError("down")
        handled.append(msg.content)  # type: ignore[arg-type]

    poller = make_poller(bus, max_deliveries=1).on_message(handler)
    poller.poll()
    for text in ("a", "b", "c"):
        bus.publish("billing", text)
    drain(poller)
    letters = bus.dead_letters("billing")
    assert [d.message().content for d in letters] == ["a", "b", "c"]  # type: ignore[union-attr]
    assert bus.dead_letter("billing", letters[1].dlq_id).error == "RuntimeError: down"
    with pytest.raises(BusError, match="no dead letter"):
        bus.dead_letter("billing", "1-1")
    fail["on"] = False
    assert len(bus.replay_dead_letters("billing", [letters[0].dlq_id])) == 1
    drain(poller)
    assert handled == ["a"] and bus.dlq_size("billing") == 2
    assert bus.purge_dead_letters("billing", [letters[1].dlq_id]) == 1
    assert bus.replay_dead_letters("billing") and bus.dlq_size("billing") == 0
    drain(poller)
    assert handled == ["a", "c"]
    assert bus.purge_dead_letters("billing") == 0


# --- replies ---------------------------------------------------------------------------

def test_respond_to_tasks_replies_and_ignores_replies(bus: Bus) -> None:
    bus.register("frontdesk")
    calls: list[str] = []

    def answer(msg: RobotMessage) -> str:
        calls.append(msg.content)  # type: ignore[arg-type]
        return f"re: {msg.content}"

    billing = make_poller(bus).respond_to_tasks(answer)
    billing.poll()
    task = bus.publish("billing", "invoice?", from_="frontdesk", conversation_id="k1")
    bus.publish("billing", "a reply", from_="frontdesk", kind="reply", in_reply_to="x")  # must not trigger
    drain(billing)
    assert calls == ["invoice?"]
    [(_, fields)] = bus.redis.xrange(bus.keys.inbox("frontdesk"))
    reply = decode_message(fields[b"envelope"])
    assert reply.kind == "reply" and reply.is_reply and reply.content == "re: invoice?"
    assert reply.in_reply_to == task.id and reply.from_ == "billing" and reply.conversation_id == "k1"


def test_redelivery_resends_recorded_reply_without_calling_handler_again(bus: Bus, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bus.register("frontdesk")
    calls: list[str] = []
    poller = make_poller(bus, consumer="w1").respond_to_tasks(lambda m: calls.append(m.content) or "paid answer")
    poller.poll()
    task = bus.publish("billing", "expensive question", from_="frontdesk")

    def lost_ack(d: Delivery) -> None:  # the worker dies between reply and XACK
        raise redis_lib.ConnectionError("connection lost")

    monkeypatch.setattr(poller, "_ack", lost_ack)
    with pytest.raises(redis_lib.ConnectionError):
        poller.poll()
    assert pending(bus, "billing") == 1 and calls == ["expensive question"]
    # the same consumer name restarts and replays its own pending entries first
    restarted = make_poller(bus, consumer="w1").respond_to_tasks(lambda m: calls.append(m.content) or "again")
    drain(restarted)
    assert calls == ["expensive question"]  # the LLM was not called twice
    replies = [decode_message(f[b"envelope"]) for _, f in bus.redis.xrange(bus.keys.inbox("frontdesk"))]
    assert [r.content for r in replies] == ["paid answer", "paid answer"]
    assert replies[0].id == replies[1].id and replies[0].in_reply_to == task.id  # dedupable
    assert pending(bus, "billing") == 0


class FakeRobot:
    def __init__(self) -> None:
        self.inputs: list[str] = []

    def run(self, message: str, **kw: Any) -> RobotResult:
        self.inputs.append(message)
        return RobotResult(robot_name="fake", output=[TextMessage(content=f"ANSWER({message})")])


def test_serve_runs_the_robot_and_replies_with_its_answer(bus: Bus) -> None:
    bus.register("frontdesk")
    robot = FakeRobot()
    poller = make_poller(bus).serve(robot)
    poller.poll()
    bus.publish("billing", {"customer": "ada", "issue": "refund"}, from_="frontdesk")
    drain(poller)
    assert robot.inputs == ["customer: ada\nissue: refund"]
    [(_, fields)] = bus.redis.xrange(bus.keys.inbox("frontdesk"))
    assert decode_message(fields[b"envelope"]).content == "ANSWER(customer: ada\nissue: refund)"


def test_serve_with_the_real_robot(bus: Bus) -> None:
    robot_mod = pytest.importorskip("robot_lab.runtime.robot")
    robot = robot_mod.build(name="billing", model="scripted/echo")
    expected = robot.run("hi there").reply  # also pays litellm's import outside the timeout
    assert expected
    poller = make_poller(bus).serve(robot)
    poller.start()
    try:
        reply = bus.request("billing", "hi there", timeout=30)
    finally:
        poller.stop()
    assert reply.content == expected and reply.from_ == "billing"


def test_request_round_trip_in_process_and_timeout(bus: Bus) -> None:
    poller = make_poller(bus).respond_to_tasks(lambda m: f"echo: {m.content}")
    with poller:
        reply = bus.request("billing", "ping", timeout=10, from_="tester")
        assert reply.content == "echo: ping" and reply.from_ == "billing"
    assert not poller.running
    started = time.monotonic()
    with pytest.raises(AwaitTimeout, match=r"no reply from robot 'billing' within 0.3 s"):
        bus.request("billing", "nobody home", timeout=0.3)
    assert time.monotonic() - started >= 0.3
    # the private reply stream is gone either way
    assert not list(bus.redis.scan_iter(match=f"{bus.keys.prefix}:bus:_reply.*"))


def test_outbox_reply_is_correlated_on_whichever_worker_gets_it(bus: Bus) -> None:
    bob = make_poller(bus, "bob").respond_to_tasks(lambda m: f"bob says hi to {m.from_}")
    alice_1 = make_poller(bus, "alice", consumer="a1")
    alice_2 = make_poller(bus, "alice", consumer="a2")
    for p in (bob, alice_1, alice_2):
        p.poll()
    sent = bus.send_message("bob", "hello bob", from_="alice")
    entry = bus.outbox("alice", sent.id)
    assert entry is not None and entry.status == "sent" and entry.replies == []
    drain(bob)
    drain(alice_2)  # the reply lands on alice's second worker
    entry = bus.outbox("alice", sent.id)
    assert entry is not None and entry.status == "replied"
    assert [r.content for r in entry.replies] == ["bob says hi to alice"]
    assert bus.wait_for_reply("alice", sent.id, timeout=1).in_reply_to == sent.id
    assert bus.outbox("alice", "no-such-id") is None


def test_envelope_without_id_gets_a_stable_id_from_the_entry(bus: Bus) -> None:
    poller = make_poller(bus).respond_to_tasks(lambda m: "ok")
    poller.poll()
    entry = bus.redis.xadd(bus.keys.inbox("billing"),
                           {"envelope": json.dumps({"to": "billing", "content": "hand made", "from": "me", "reply_to": "me"})})
    drain(poller)
    [(_, fields)] = bus.redis.xrange(bus.keys.inbox("me"))
    assert decode_message(fields[b"envelope"]).in_reply_to == f"billing/{entry.decode()}"
    assert bus.redis.ttl(bus.keys.inbox("me")) > 0  # created for the reply, expires


def test_reply_stream_ttl_is_pushed_out_by_each_reply_and_inboxes_never_get_one(bus: Bus) -> None:
    ttl = int(bus.settings.reply_ttl)
    me = bus.keys.inbox("me")
    bus._append("me", b"{}", mode="reply")
    assert 0 < bus.redis.ttl(me) <= ttl
    bus.redis.expire(me, 5)  # a reply stream about to expire mid-conversation
    bus._append("me", b"{}", mode="reply")
    assert bus.redis.ttl(me) > 5  # pushed out again by the new reply
    bus.redis.expire(me, ttl * 2)  # a longer TTL (a requester's own choice) is never shortened
    bus._append("me", b"{}", mode="reply")
    assert bus.redis.ttl(me) > ttl
    billing = bus.keys.inbox("billing")
    bus.redis.xadd(billing, {"envelope": b"{}"})  # a robot's inbox: no TTL
    bus._append("billing", b"{}", mode="reply")
    assert bus.redis.ttl(billing) == -1


# --- conversations ---------------------------------------------------------------------

def test_conversation_key_is_the_keys_layout(bus: Bus) -> None:
    poller = make_poller(bus)
    gate = threading.Event()
    poller.on_message(lambda m: gate.wait(5))
    poller.poll()
    msg = bus.publish("billing", "x", conversation_id="conv-9")
    poller._read()  # queue it without handling
    key = bus.keys.conversation_queue("billing")
    [member] = bus.redis.zrange(key, 0, -1)
    assert queue_entry(member, "conv-9").encode() == bus.redis.xrange(bus.keys.inbox("billing"))[0][0]
    assert member.startswith(b"6:conv-9:0000")  # length-prefixed id, zero-padded entry id
    gate.set()
    drain(poller)
    assert not bus.redis.exists(key) and msg.conversation_id == "conv-9"


def test_conversation_waits_for_its_head_on_another_consumer(bus: Bus) -> None:
    started, release = threading.Event(), threading.Event()
    log: list[tuple[str, str]] = []

    def slow(msg: RobotMessage) -> None:
        log.append(("p1", msg.content))  # type: ignore[arg-type]
        started.set()
        release.wait(10)

    p1 = make_poller(bus, consumer="p1", batch_size=1).on_message(slow)
    p2 = make_poller(bus, consumer="p2", batch_size=4).on_message(lambda m: log.append(("p2", m.content)))
    p1.poll()
    p2.poll()
    bus.publish("billing", "c1-first", conversation_id="c1")
    bus.publish("billing", "c1-second", conversation_id="c1")
    bus.publish("billing", "other", conversation_id="c2")
    worker = threading.Thread(target=p1.poll, kwargs={"max_messages": 1})
    worker.start()
    try:
        assert started.wait(60)
        assert p2.poll() == 1  # c2 runs, c1-second must wait for c1-first
        assert log == [("p1", "c1-first"), ("p2", "other")]
        assert p2.poll() == 0 and p2.held == 1
    finally:
        release.set()
        worker.join(5)
    assert p2.poll() == 1
    assert log[-1] == ("p2", "c1-second") and pending(bus, "billing") == 0


def test_conversations_stay_ordered_with_two_threaded_consumers(bus: Bus) -> None:
    r = bus.redis
    order: dict[str, list[int]] = {}
    busy: set[str] = set()
    overlaps: list[str] = []
    lock = threading.Lock()

    def handler(msg: RobotMessage) -> None:
        conv = msg.conversation_id or ""
        with lock:
            if conv in busy:
                overlaps.append(conv)
            busy.add(conv)
        time.sleep(0.0005 * (msg.content["seq"] % 3))  # type: ignore[index]
        with lock:
            order.setdefault(conv, []).append(msg.content["seq"])  # type: ignore[index]
            busy.discard(conv)

    pollers = [make_poller(bus, consumer=f"t{i}", batch_size=3, block_ms=50).on_message(handler) for i in range(2)]
    for p in pollers:
        p.poll()
    n_conv, per_conv = 4, 15
    for seq in range(per_conv):
        for c in range(n_conv):
            bus.publish("billing", {"seq": seq}, conversation_id=f"conv{c}")
    for p in pollers:
        p.start()
    try:
        wait_for(lambda: sum(len(v) for v in order.values()) == n_conv * per_conv, timeout=30)
    finally:
        for p in pollers:
            p.stop()
    assert overlaps == []
    assert order == {f"conv{c}": list(range(per_conv)) for c in range(n_conv)}
    assert pending(bus, "billing") == 0
    assert not r.exists(bus.keys.conversation_queue("billing"))


def test_failed_head_blocks_its_conversation_until_dead_lettered(bus: Bus) -> None:
    seen: list[str] = []

    def handler(msg: RobotMessage) -> None:
        if msg.content == "bad":
            raise ValueError("nope")
        seen.append(msg.content)  # type: ignore[arg-type]

    poller = make_poller(bus, max_deliveries=2).on_message(handler)
    poller.poll()
    bus.publish("billing", "bad", conversation_id="k")
    bus.publish("billing", "next", conversation_id="k")
    drain(poller)
    assert seen == ["next"] and bus.dead_letters("billing")[0].reason == "failed"


# --- recovery --------------------------------------------------------------------------

def test_entries_of_a_dead_consumer_are_reclaimed_and_it_is_deleted(bus: Bus) -> None:
    bus.register("billing")
    inbox = bus.keys.inbox("billing")
    for i in range(3):
        bus.publish("billing", f"m{i}")
    bus.redis.xreadgroup("billing", "dead-worker", {inbox: ">"}, count=3)  # then it dies
    assert pending(bus, "billing", "dead-worker") == 3
    seen: list[tuple[str, int]] = []
    rescuer = make_poller(bus, consumer="rescuer", visibility_timeout=0.05, claim_interval=0.01)
    rescuer.on_message(lambda d, m: (seen.append((m.content, d.deliveries)), d.ack()))
    time.sleep(0.08)  # let the entries become older than the visibility timeout
    drain(rescuer)
    assert sorted(seen) == [("m0", 2), ("m1", 2), ("m2", 2)]
    names = [c["name"] for c in bus.redis.xinfo_consumers(inbox, "billing")]
    assert b"dead-worker" not in names
    assert pending(bus, "billing") == 0 and rescuer.counts["reclaimed"] == 3


def test_live_consumer_keeps_its_entries_with_heartbeats(bus: Bus) -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(msg: RobotMessage) -> None:
        started.set()
        release.wait(10)

    owner = make_poller(bus, consumer="owner", visibility_timeout=0.4, block_ms=20).on_message(slow)
    thief = make_poller(bus, consumer="thief", visibility_timeout=0.4, claim_interval=0.01)
    stolen: list[str] = []
    thief.on_message(lambda m: stolen.append(m.content))
    owner.poll()
    bus.publish("billing", "long job")
    owner.start()
    try:
        assert started.wait(60)
        end = time.monotonic() + 1.2  # three visibility timeouts
        while time.monotonic() < end:
            thief.poll(block_ms=20)
        assert stolen == []
    finally:
        release.set()
        owner.stop()
    assert pending(bus, "billing") == 0


def test_restart_replays_own_pending_first(bus: Bus) -> None:
    bus.register("billing")
    inbox = bus.keys.inbox("billing")
    bus.publish("billing", "left over")
    bus.redis.xreadgroup("billing", "worker-7", {inbox: ">"}, count=10)  # read, then crashed
    bus.publish("billing", "new")
    seen: list[tuple[str, int]] = []
    again = make_poller(bus, consumer="worker-7").on_message(lambda d, m: (seen.append((m.content, d.deliveries)), d.ack()))
    drain(again)
    assert seen == [("left over", 2), ("new", 1)]


def test_stop_hands_back_unstarted_entries_without_counting_them(bus: Bus) -> None:
    first = make_poller(bus, consumer="first", batch_size=5)
    first.poll()
    for i in range(5):
        bus.publish("billing", f"m{i}")
    assert first.poll(max_messages=1) == 1 and first.held == 4
    assert first.hand_back() == 4 and first.held == 0
    seen: list[tuple[str, int]] = []
    second = make_poller(bus, consumer="second", visibility_timeout=30)
    second.on_message(lambda d, m: (seen.append((m.content, d.deliveries)), d.ack()))
    drain(second)
    assert seen == [(f"m{i}", 1) for i in range(1, 5)]


def test_max_deliveries_reached_by_crashes_goes_to_dlq_without_running(bus: Bus) -> None:
    bus.register("billing")
    inbox = bus.keys.inbox("billing")
    bus.publish("billing", "kills workers")
    bus.redis.xreadgroup("billing", "w", {inbox: ">"})
    [row] = bus.redis.xpending_range(inbox, "billing", "-", "+", 1)
    bus.redis.xclaim(inbox, "billing", "w", 0, [row["message_id"]], retrycount=5, justid=True)
    ran: list[str] = []
    poller = make_poller(bus, consumer="w", max_deliveries=5).on_message(lambda m: ran.append(m.content))
    drain(poller)
    assert ran == []
    [letter] = bus.dead_letters("billing")
    assert letter.reason == "max_deliveries" and letter.deliveries == 6


def test_embedded_thread_start_stop(bus: Bus) -> None:
    seen: list[str] = []
    poller = make_poller(bus, block_ms=50).on_message(lambda m: seen.append(m.content))
    poller.start()
    try:
        wait_for(lambda: bus.exists("billing"))
        for i in range(10):
            bus.publish("billing", f"m{i}")
        wait_for(lambda: len(seen) == 10)
    finally:
        poller.stop()
    assert not poller.running and seen == [f"m{i}" for i in range(10)]


def test_stats(bus: Bus) -> None:
    poller = make_poller(bus, max_deliveries=1).on_message(lambda m: (_ for _ in ()).throw(RuntimeError("x")))
    poller.poll()
    bus.publish("billing", "a")
    bus.publish("billing", "b")
    bus.redis.xreadgroup("billing", "other", {bus.keys.inbox("billing"): ">"}, count=1)
    [row] = bus.stats(["billing"])
    assert (row.robot, row.length, row.groups, row.pending, row.dlq) == ("billing", 2, 1, 1, 0)
    assert row.lag in (1, None)
    drain(poller)
    [row] = bus.stats()
    assert row.dlq == 1 and row.consumers == 2
    [missing] = bus.stats(["ghost"])
    assert missing.length == 0 and missing.groups == 0


def test_encode_roundtrip_keeps_unknown_fields(bus: Bus) -> None:
    seen: list[RobotMessage] = []
    poller = make_poller(bus).on_message(seen.append)
    poller.poll()
    doc = json.loads(encode_message(RobotMessage(to="billing", content="x")))
    doc["x_priority"] = "high"
    bus.redis.xadd(bus.keys.inbox("billing"), {"envelope": json.dumps(doc)})
    drain(poller)
    assert seen[0].extensions == {"x_priority": "high"}


def test_request_to_a_robot_that_dead_letters_it_fails_fast(redis_client) -> None:
    from robot_lab.errors import RemoteError

    bus = Bus(redis_client)
    poller = BusPoller("grumpy", bus, max_deliveries=1, retry_delay=0.01, block_ms=50)
    poller.respond_to_tasks(lambda message: (_ for _ in ()).throw(RuntimeError("cannot do it")))
    poller.start()
    try:
        with pytest.raises(RemoteError, match="robot 'grumpy' could not handle message .*cannot do it") as info:
            bus.request("grumpy", "please", timeout=30)
        assert info.value.reason == "failed"
        assert bus.dlq_size("grumpy") == 1  # the dead letter is still recorded
    finally:
        poller.stop()


def test_heartbeat_thread_logs_a_redis_outage_once_and_its_end(bus: Bus) -> None:
    """A heartbeat failing beat after beat while Redis is away is one redis.lost and one
    redis.back (not a warning per beat); any other failure is still logged each time."""
    from structlog.testing import capture_logs

    poller = make_poller(bus, "beater", visibility_timeout=0.06)
    outcomes = [redis_lib.ConnectionError("down")] * 4 + [None, ValueError("odd"), None]
    done = threading.Event()

    def beat() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if not outcomes:
            done.set()
        if outcome is not None:
            raise outcome

    poller._heartbeat = beat  # type: ignore[method-assign]
    stop = threading.Event()
    with capture_logs() as logs:
        thread = threading.Thread(target=poller._heartbeat_loop, args=(stop,))
        thread.start()
        assert done.wait(60)
        stop.set()
        thread.join(5)
    events = [e["event"] for e in logs]
    assert events == ["redis.lost", "redis.back", "bus.heartbeat_failed"]
