"""The round trips of a served message (BusPoller.respond_to_tasks / serve): its first reads
(the request its conversation waits on, the reply record) go in one, and every per-message
command rides robot_lab.coalesce, so an in-flight worker's handlers share round trips."""

from __future__ import annotations

from typing import Any

import pytest

from robot_lab import coalesce
from robot_lab.bus import Bus, BusPoller


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each round trip made through robot_lab.coalesce: its commands' names and first keys."""
    seen: list[list[str]] = []
    execute, call, script = coalesce.execute, coalesce.call, coalesce.script

    def spy_execute(pipe: Any, raise_on_error: bool = True, **kw: Any) -> Any:
        seen.append([f"{args[0]} {args[1]}" for args, _ in pipe.command_stack])
        return execute(pipe, raise_on_error, **kw)

    def spy_call(client: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append([f"{name.upper()} {args[0]}"])
        return call(client, name, *args, **kwargs)

    def spy_script(lua: Any, keys: list[Any], args: list[Any], **kw: Any) -> Any:
        seen.append([f"SCRIPT {keys[0]}"])
        return script(lua, keys, args, **kw)

    monkeypatch.setattr(coalesce, "execute", spy_execute)
    monkeypatch.setattr(coalesce, "call", spy_call)
    monkeypatch.setattr(coalesce, "script", spy_script)
    return seen


def test_a_served_message_reads_in_one_round_trip_and_writes_through_the_group_commit(
        redis_client: Any, trips: list[list[str]]) -> None:
    bus = Bus(redis_client)
    bus.register("billing")
    bus.register("client")
    p = BusPoller("billing", bus, consumer="c1", block_ms=0).respond_to_tasks(lambda m: f"re: {m.content}")
    msg = bus.publish("billing", "hi", from_="client", conversation_id="conv1")
    assert p.run_once() == 1
    keys = bus.keys
    record = keys.replied_for("billing", msg.key)
    assert trips[0] == [f"GET {keys.parked_conversation('billing', 'conv1')}", f"GET {record}"]
    assert trips[1:] == [[f"SET {record}"], [f"SCRIPT {keys.inbox('client')}"],  # the record, the reply,
                         [f"SCRIPT {keys.inbox('billing')}"]]  # then the ack (COMPLETE): in that order
    [(_, fields)] = redis_client.xrange(keys.inbox("client"))
    assert b"re: hi" in fields[b"envelope"]
    assert redis_client.xpending(keys.inbox("billing"), "billing")["pending"] == 0
    trips.clear()
    bus.redis.xadd(keys.inbox("billing"), {"envelope": redis_client.xrange(keys.inbox("billing"))[0][1][b"envelope"]})
    assert p.run_once() == 1  # the same message again: the record answers (one read, no run)
    assert trips[0] == [f"GET {keys.parked_conversation('billing', 'conv1')}", f"GET {record}"]
    assert len(redis_client.xrange(keys.inbox("client"))) == 2  # the recorded reply re-sent


def test_a_free_message_reads_its_record_alone_and_acks_through_the_group_commit(
        redis_client: Any, trips: list[list[str]]) -> None:
    bus = Bus(redis_client)
    bus.register("billing")
    p = BusPoller("billing", bus, consumer="c1", block_ms=0, in_flight=2).respond_to_tasks(lambda m: None)
    msg = bus.publish("billing", "hi", from_="client")
    p.run_once()
    p.drain(10)
    p.run_once()
    record = bus.keys.replied_for("billing", msg.key)
    assert trips[0] == [f"GET {record}"]  # no conversation: nothing waits
    assert trips[1:] == [[f"SET {record}"], [f"XACK {bus.keys.inbox('billing')}"]]
    assert redis_client.xpending(bus.keys.inbox("billing"), "billing")["pending"] == 0
