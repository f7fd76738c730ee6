"""``robot-lab send | tail | bus stats | dlq ...`` on fakeredis and real Redis."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from robot_lab.bus import Bus, BusPoller
from robot_lab.cli import main
from robot_lab.schemas import decode_message


@pytest.fixture
def bus(redis_client) -> Bus:  # type: ignore[no-untyped-def]
    return Bus()  # the CLI's own view: get_redis() and the test's key prefix


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_send_to_unknown_robot_fails_with_the_name(bus: Bus) -> None:
    code, out = run("send", "ghost", "hello")
    assert code == 1 and "Unknown channel: 'ghost'" in out


def test_send_publishes_and_prints_the_id(bus: Bus) -> None:
    bus.register("billing")
    code, out = run("send", "billing", "hello", "--conversation", "c-1", "--from", "ops")
    assert code == 0
    [(_, fields)] = bus.redis.xrange(bus.keys.inbox("billing"))
    msg = decode_message(fields[b"envelope"])
    assert out.strip() == msg.id and msg.content == "hello"
    assert msg.conversation_id == "c-1" and msg.from_ == "ops"
    code, out = run("send", "billing", '{"a": 1}', "--content-json")
    assert code == 0
    assert decode_message(bus.redis.xrange(bus.keys.inbox("billing"))[-1][1][b"envelope"]).content == {"a": 1}
    code, out = run("send", "billing", "[1]", "--content-json")
    assert code == 2 and "JSON object" in out
    # --json is the output format, as for every other command
    code, out = run("send", "billing", '{"a": 1}', "--json")
    last = decode_message(bus.redis.xrange(bus.keys.inbox("billing"))[-1][1][b"envelope"])
    assert code == 0 and json.loads(out) == {"id": last.id} and last.content == '{"a": 1}'


def test_send_wait_prints_the_reply_and_times_out_cleanly(bus: Bus) -> None:
    poller = BusPoller("billing", bus, block_ms=50, consumer="cli-test")
    poller.respond_to_tasks(lambda m: f"got {m.content}")
    with poller:
        code, out = run("send", "billing", "ping", "--wait", "--timeout", "10")
        assert code == 0 and out.strip() == "got ping"
        code, out = run("send", "billing", "pong", "--wait", "--timeout", "10", "--json")
    assert code == 0 and json.loads(out)["reply"] == "got pong" and json.loads(out)["id"]
    code, out = run("send", "billing", "ping", "--wait", "--timeout", "0.2")
    assert code == 1 and "no reply from robot 'billing' within 0.2 s" in out


def test_tail_prints_entries(bus: Bus) -> None:
    bus.register("billing")
    bus.publish("billing", "first", from_="a", conversation_id="k")
    bus.redis.xadd(bus.keys.inbox("billing"), {"envelope": "garbage"})
    code, out = run("tail", "billing", "--from-start", "--count", "2")
    assert code == 0
    lines = out.strip().splitlines()
    assert "a -> billing [message] conv=k  first" in lines[0]
    assert "INVALID" in lines[1]
    code, out = run("tail", "billing", "--timeout", "0.3")  # only new entries: none
    assert code == 0 and out == ""
    code, out = run("tail", "nobody", "--timeout", "0.1")
    assert code == 1 and "Unknown channel" in out


def test_bus_stats_and_dlq_commands(bus: Bus) -> None:
    poller = BusPoller("billing", bus, block_ms=0, consumer="c", max_deliveries=1, retry_delay=0)
    poller.on_message(lambda m: (_ for _ in ()).throw(RuntimeError("boom")))
    poller.poll()
    bus.publish("billing", "one")
    bus.publish("billing", "two")
    poller.poll()
    code, out = run("bus", "stats", "--json")
    assert code == 0
    [row] = json.loads(out)
    assert row["robot"] == "billing" and row["length"] == 2 and row["dlq"] == 2 and row["pending"] == 0
    code, out = run("bus", "stats")
    assert code == 0 and "billing" in out

    code, out = run("dlq", "list", "billing", "--json")
    letters = json.loads(out)
    assert [d["error"] for d in letters] == ["RuntimeError: boom"] * 2
    first = letters[0]["dlq_id"]
    code, out = run("dlq", "show", "billing", first)
    assert code == 0 and json.loads(out)["envelope"]["content"] == "one"
    code, out = run("dlq", "show", "billing", "1-1")
    assert code == 1 and "no dead letter" in out
    code, out = run("dlq", "replay", "billing")
    assert code == 2 and "--all" in out
    code, out = run("dlq", "replay", "billing", first)
    assert code == 0 and "replayed 1" in out
    code, out = run("dlq", "purge", "billing", "--all")
    assert code == 0 and "purged 1" in out
    code, out = run("dlq", "list", "billing")
    assert "no dead letters" in out
    assert bus.redis.xlen(bus.keys.inbox("billing")) == 3  # the replayed one is back
    # a misspelt robot is an error naming the known ones, not "0 dead letters" (embedded
    # mode knows no robots of other processes: it says so instead)
    from robot_lab.settings import get_settings

    if get_settings().embedded:
        code, out = run("dlq", "list", "bilng")
        assert code == 0 and "no REDIS_URL" in out
        return
    for args in (["list", "bilng"], ["replay", "bilng", "--all"], ["purge", "bilng", "--all"]):
        code, out = run("dlq", *args)
        assert code == 1 and "unknown robot 'bilng'" in out and "known: billing" in out, (args, out)
