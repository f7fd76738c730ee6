"""A consumer never dies of its input, and the protocol is strict.

The fuzz test sends arbitrary stream entries -- arbitrary field names and bytes, arbitrary
JSON, deep nesting, huge values, wrong types in every envelope field -- between good
messages to a real consumer on a real Redis, and asserts that the good messages are still
answered, that every entry made to be bad is in the DLQ with a reason, and that every entry
ends answered or dead-lettered (nothing pending). The other tests pin one failure row each
of docs/operations.md "Failure modes / Bus".
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_lab.bus import Bus, BusPoller
from robot_lab.errors import BusError
from robot_lab.keys import Keys
from robot_lab.schemas import RobotMessage, decode_message
from robot_lab.settings import BusSettings

ROBOT = "fuzzed"
LIMIT = 64 * 1024  # max_envelope_bytes in these tests


def make_bus(client: redis.Redis, keys: Keys, **kw: Any) -> Bus:
    # the fuzzed senders reply to client inboxes other than their own "from": allowed here
    # (the reply_to rule itself is tested in tests/test_security_replies.py)
    kw.setdefault("reply_to_allowed", ["fuzz-client", "other-client"])
    cfg = BusSettings(max_envelope_bytes=LIMIT, max_deliveries=2, retry_delay=0, **kw)
    return Bus(client, keys=keys, settings=cfg)


def answer(message: RobotMessage) -> str:
    return f"re: {str(message.content)[:40]}"


def resolve_all(poller: BusPoller, bus: Bus, rounds: int = 200) -> None:
    inbox = bus.keys.inbox(ROBOT)
    for _ in range(rounds):
        poller.poll(block_ms=0)
        [group] = bus.redis.xinfo_groups(inbox)
        if not group["pending"] and not group["lag"] and not poller.held:
            return
    raise AssertionError(f"not resolved: {bus.redis.xpending(inbox, ROBOT)}")


def replies_to(bus: Bus, stream: str) -> dict[str, list[RobotMessage]]:
    out: dict[str, list[RobotMessage]] = {}
    for _, fields in bus.redis.xrange(bus.keys.inbox(stream)):
        reply = decode_message(fields[b"envelope"])
        out.setdefault(reply.in_reply_to or "", []).append(reply)
    return out


def dead_by_entry(bus: Bus) -> dict[str, Any]:
    return {d.entry_id: d for d in bus.dead_letters(ROBOT, 10_000)}


# --- strategies ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
not_a_string = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
# a wrong value for each envelope field (a type or value no valid envelope has)
WRONG: dict[str, st.SearchStrategy[Any]] = {
    "to": not_a_string.filter(lambda v: v is not None) | st.just(""),
    "content": st.none() | st.booleans() | st.integers() | st.lists(st.integers(), max_size=3),
    "id": not_a_string.filter(lambda v: v is not None),
    "v": st.integers().filter(lambda v: v != 1) | st.text(max_size=3) | st.none(),
    "kind": st.text(max_size=10).filter(lambda k: k not in ("message", "reply", "error")) | st.integers(),
    "from": not_a_string,
    "reply_to": st.sampled_from(["has space", "a:b", "x{y}", ""]) | st.integers(),
    "conversation_id": not_a_string.filter(lambda v: v is not None),
    "created_at": st.sampled_from(["yesterday", "2026-13-45T00:00:00Z", "2030-01-01T00:00:00"]) | st.integers(),
    "deadline": st.sampled_from(["soon", "2030-01-01T00:00:00", "31/12/2030"]) | st.integers() | st.booleans(),
    "headers": st.lists(st.text(max_size=3), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(),
                                                                         min_size=1, max_size=2),
    "signature": st.integers() | st.lists(st.integers(), max_size=2),
}


def good_envelope(n: int, conv: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"v": 1, "id": f"good-{n}", "to": ROBOT, "from": "fuzzer", "reply_to": "fuzz-client",
                           "content": f"good {n}"}
    if conv:
        doc["conversation_id"] = conv
    return doc


@st.composite
def bad_entries(draw: st.DrawFn) -> tuple[dict[bytes, bytes], bool]:
    """(entry fields, surely bad). Entries that are not surely bad must still be resolved."""
    shape = draw(st.sampled_from(["fields", "bytes", "json", "deep", "huge", "wrong_type", "conv_wrong"]))
    if shape == "fields":  # arbitrary field names and values, no envelope field
        fields = draw(st.dictionaries(st.binary(min_size=1, max_size=12).filter(lambda k: k != b"envelope"),
                                      st.binary(max_size=64), min_size=1, max_size=4))
        return fields, True
    if shape == "bytes":
        raw = draw(st.binary(max_size=200))
        return {b"envelope": raw}, True
    if shape == "json":  # any JSON at all: an object without "to" + "content" is surely bad
        doc = draw(json_values)
        surely = not (isinstance(doc, dict) and "to" in doc and "content" in doc)
        return {b"envelope": json.dumps(doc).encode()}, surely
    if shape == "deep":
        depth = draw(st.sampled_from([600, 5_000, 100_000]))
        inner = draw(st.sampled_from(["[", '{"a":']))
        close = "]" if inner == "[" else "}"
        nested = inner * depth + "1" + close * depth
        doc = f'{{"v":1,"to":"{ROBOT}","reply_to":"fuzz-client","content":{{"x":{nested}}}}}'
        return {b"envelope": doc.encode()}, False  # decodable or not: it must be resolved
    if shape == "huge":
        doc = good_envelope(0, None) | {"id": f"huge-{uuid.uuid4().hex}", "content": "x" * (LIMIT + 10)}
        return {b"envelope": json.dumps(doc).encode()}, True
    name = draw(st.sampled_from(sorted(WRONG)))
    doc = good_envelope(0, "conv-bad" if shape == "conv_wrong" else None) | {"id": f"bad-{uuid.uuid4().hex}"}
    doc[name] = draw(WRONG[name])
    return {b"envelope": json.dumps(doc).encode()}, True


@pytest.fixture
def world(real_redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(real_redis_url)
    yield client, real_redis_url
    client.close()


@settings(max_examples=int(os.environ.get("ROBOT_LAB_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(bad=st.lists(bad_entries(), min_size=1, max_size=4), conv=st.sampled_from([None, "conv-good", "conv-bad"]))
def test_fuzzed_entries_never_stop_the_consumer(world: tuple[redis.Redis, str], bad: list[Any], conv: str | None) -> None:
    client, _ = world
    keys = Keys(f"rlfuzz-{uuid.uuid4().hex[:10]}")
    bus = make_bus(client, keys)
    try:
        bus.register(ROBOT)
        inbox = keys.inbox(ROBOT)
        poller = BusPoller(ROBOT, bus, consumer="fuzz", block_ms=0, batch_size=3)
        poller.respond_to_tasks(answer)
        good_ids, bad_ids, other_ids = [], [], []
        client.xadd(inbox, {"envelope": json.dumps(good_envelope(0, conv))})
        good_ids.append("good-0")
        for i, (fields, surely) in enumerate(bad):
            entry = client.xadd(inbox, fields).decode()
            (bad_ids if surely else other_ids).append(entry)
            client.xadd(inbox, {"envelope": json.dumps(good_envelope(i + 1, conv))})
            good_ids.append(f"good-{i + 1}")
        resolve_all(poller, bus)
        answered = replies_to(bus, "fuzz-client")
        for gid in good_ids:  # every good message answered once, with content
            assert [r.content for r in answered.get(gid, []) if r.kind == "reply"] == [f"re: good {gid[5:]}"]
        dead = dead_by_entry(bus)
        for entry in bad_ids:
            assert entry in dead and dead[entry].reason in ("invalid", "too_large", "unsupported"), (entry, dead.get(entry))
            assert len(dead[entry].envelope) <= LIMIT  # a huge entry is not stored twice
        assert bus.redis.xpending(inbox, ROBOT)["pending"] == 0
        assert not client.exists(keys.conversation_heads(ROBOT))
    finally:
        found = list(client.scan_iter(match=f"{keys.prefix}*", count=1000))
        if found:
            client.delete(*found)


# --- one test per failure row ---------------------------------------------------------

@pytest.fixture
def bus(redis_client) -> Bus:  # type: ignore[no-untyped-def]
    from robot_lab.keys import default_keys

    b = make_bus(redis_client, default_keys())
    b.register(ROBOT)
    return b


def consumer(bus: Bus) -> BusPoller:
    return BusPoller(ROBOT, bus, consumer="c1", block_ms=0).respond_to_tasks(answer)


def xadd(bus: Bus, doc: dict[str, Any]) -> str:
    return bus.redis.xadd(bus.keys.inbox(ROBOT), {"envelope": json.dumps(doc)}).decode()


@pytest.mark.parametrize(("change", "reason", "says"), [
    ({"v": 999}, "unsupported", "v=999 is not supported"),
    ({"kind": "banana"}, "unsupported", "kind 'banana' is not supported"),
    ({"deadline": "2030-01-01T00:00:00"}, "invalid", "has no timezone"),
    ({"content": ["not", "allowed"]}, "invalid", "content"),
    ({"content": "x" * (LIMIT + 1)}, "too_large", "the limit is 65536"),
])
def test_refused_envelope_is_dead_lettered_and_its_sender_gets_an_error(bus: Bus, change: dict[str, Any],
                                                                        reason: str, says: str) -> None:
    entry = xadd(bus, good_envelope(1, None) | {"id": "m-1"} | change)
    resolve_all(consumer(bus), bus)
    [letter] = bus.dead_letters(ROBOT)
    assert letter.entry_id == entry and letter.reason == reason and says in letter.error
    [error] = replies_to(bus, "fuzz-client")["m-1"]
    assert error.kind == "error" and error.headers["error"] == reason and says in str(error.content)


def test_unreadable_entry_with_a_readable_reply_to_gets_an_error_envelope(bus: Bus) -> None:
    xadd(bus, {"id": "broken-1", "reply_to": "fuzz-client", "to": 42, "content": "x"})
    bus.redis.xadd(bus.keys.inbox(ROBOT), {"envelope": b'{"reply_to": "fuzz-client", "id": "broken-2", '})
    resolve_all(consumer(bus), bus)
    assert [d.reason for d in bus.dead_letters(ROBOT)] == ["invalid", "invalid"]
    got = replies_to(bus, "fuzz-client")
    assert got["broken-1"][0].kind == "error" and "to" in str(got["broken-1"][0].content)
    assert "broken-2" not in got  # not JSON: its reply_to cannot be read


def test_duplicate_id_with_other_content_or_sender(bus: Bus) -> None:
    seen: list[str] = []
    poller = BusPoller(ROBOT, bus, consumer="c1", block_ms=0)
    poller.respond_to_tasks(lambda m: (seen.append(str(m.content)), f"re: {m.content}")[1])
    first = good_envelope(1, None) | {"id": "same"}
    xadd(bus, first)
    xadd(bus, first | {"created_at": "2026-01-01T00:00:00Z"})  # the sender published it again
    xadd(bus, first | {"content": "something else"})  # same id, same sender, other content
    xadd(bus, first | {"from": "someone-else", "reply_to": "other-client"})  # same id, other sender
    resolve_all(poller, bus)
    assert seen == ["good 1", "good 1"]  # once for fuzzer, once for someone-else
    mine = replies_to(bus, "fuzz-client")["same"]
    assert [r.kind for r in mine] == ["reply", "reply", "error"]
    assert mine[0].id == mine[1].id  # the re-published one got the recorded reply
    assert "already used for a different message" in str(mine[2].content)
    assert [r.content for r in replies_to(bus, "other-client")["same"]] == ["re: good 1"]
    [letter] = bus.dead_letters(ROBOT)
    assert letter.reason == "duplicate_id" and json.loads(letter.envelope)["content"] == "something else"


def test_reply_to_an_invalid_target_is_dead_lettered_with_the_reply(bus: Bus) -> None:
    xadd(bus, {"v": 1, "id": "m-2", "to": ROBOT, "from": "no such:inbox", "content": "hi"})
    resolve_all(consumer(bus), bus)
    [letter] = bus.dead_letters(ROBOT)
    assert letter.reason == "unroutable_reply" and "'no such:inbox' is not a valid inbox name" in letter.error
    fields = bus.redis.xrange(bus.keys.dlq(ROBOT))[0][1]
    assert decode_message(fields[b"reply"]).content == "re: hi"


def test_publish_refuses_an_envelope_over_the_limit(bus: Bus) -> None:
    with pytest.raises(BusError, match="the limit is 65536"):
        bus.publish(ROBOT, "x" * (LIMIT + 1))


def test_consumers_trim_an_inbox_fed_by_raw_xadd_but_keep_what_is_not_done(bus: Bus) -> None:
    small = make_bus(bus.redis, bus.keys, maxlen=5)
    handled: list[str] = []
    poller = BusPoller(ROBOT, small, consumer="c1", block_ms=0, claim_interval=0.0001)
    poller.on_message(lambda m: handled.append(m.id))
    inbox = bus.keys.inbox(ROBOT)
    for i in range(30):
        xadd(bus, good_envelope(i, None))
    poller._read()  # 16 delivered and held, 14 not yet delivered: nothing may go
    poller._trim()
    assert bus.redis.xlen(inbox) == 30
    resolve_all(poller, small)
    poller.poll(block_ms=0)  # a sweep after everything is done trims to maxlen
    assert bus.redis.xlen(inbox) <= 5
    assert handled == [f"good-{i}" for i in range(30)]


def test_per_message_state_expires(bus: Bus) -> None:
    xadd(bus, good_envelope(7, "conv-ttl") | {"id": "m-ttl"})
    resolve_all(consumer(bus), bus)
    record = bus.keys.replied_for(ROBOT, "fuzzer:m-ttl")
    assert 0 < bus.redis.ttl(record) <= bus.settings.record_ttl
    # the conversation's ordering state is gone with its last entry
    assert not bus.redis.exists(bus.keys.conversation_queue(ROBOT))
    assert not bus.redis.exists(bus.keys.conversation_heads(ROBOT))


def test_stored_conversation_history_is_a_window_of_whole_turns(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import robot_lab
    from robot_lab import settings as settings_module
    from robot_lab.runtime.conversations import ConversationStore

    monkeypatch.setenv("ROBOT_LAB_CONVERSATION_MAX_MESSAGES", "6")
    monkeypatch.setattr(settings_module, "_settings", None)
    robot = robot_lab.build(name="chatty")
    for i in range(10):
        robot.run(f"turn {i}", conversation_id="long")
    history = ConversationStore().load("chatty", "long")
    assert 0 < len(history) <= 6 and history[0]["role"] == "user"
    assert history[-2]["content"] == "turn 9"  # the latest turn is kept, the oldest ones went
    assert "turn 0" not in [m["content"] for m in history]


def test_manual_reply_to_an_invalid_target_dead_letters_the_delivery(bus: Bus) -> None:
    xadd(bus, {"v": 1, "id": "m-3", "to": ROBOT, "from": "bad name", "content": "hi"})
    poller = BusPoller(ROBOT, bus, consumer="c1", block_ms=0)
    poller.on_message(lambda d, m: d.reply("re: hi") and d.ack())
    resolve_all(poller, bus)
    [letter] = bus.dead_letters(ROBOT)
    assert letter.reason == "unroutable_reply"
    with pytest.raises(BusError, match="'bad name' is not a valid inbox name"):
        bus.send_reply(letter.message(), "again")  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [
    b'{"v":1,"to":"fuzzed","reply_to":"fuzz-client","content":"x","conversation_id":"\xff\xfe"}',
    b'{"v":1,"to":"fuzzed","content":"x","conversation_id":"' + b"c" * 100_000 + b'"}',
    b'{"v":1,"to":"fuzzed","content":"x","conversation_id":"a","conversation_id":"b"}',
])
def test_odd_conversation_ids_are_resolved(bus: Bus, raw: bytes) -> None:
    bus.redis.xadd(bus.keys.inbox(ROBOT), {"envelope": raw})
    xadd(bus, good_envelope(1, "conv-x"))
    poller = consumer(bus)
    resolve_all(poller, bus)
    assert [r.content for r in replies_to(bus, "fuzz-client")["good-1"]] == ["re: good 1"]
    assert not bus.redis.exists(bus.keys.conversation_heads(ROBOT))


def test_too_deep_or_too_large_entries_with_a_readable_reply_to_get_an_error_envelope(bus: Bus) -> None:
    """Neither nesting 30,000 deep nor a size over the limit hides a top-level ``reply_to``:
    the sender is told, as for any other unreadable entry (a truncated one still is not)."""
    inbox = bus.keys.inbox(ROBOT)
    deep = b'{"id": "deep-1", "reply_to": "fuzz-client", "to": "fuzzed", "content": ' + b"[" * 30_000 + \
        b"]" * 30_000 + b"}"
    large = json.dumps({"content": "x" * (LIMIT * 5), "id": "large-1", "reply_to": "fuzz-client"}).encode()
    bus.redis.xadd(inbox, {"envelope": deep})
    bus.redis.xadd(inbox, {"envelope": large})
    resolve_all(consumer(bus), bus)
    assert [d.reason for d in bus.dead_letters(ROBOT)] == ["invalid", "too_large"]
    got = replies_to(bus, "fuzz-client")
    assert got["deep-1"][0].kind == "error" and got["large-1"][0].kind == "error"
    assert "limit" in str(got["large-1"][0].content)
