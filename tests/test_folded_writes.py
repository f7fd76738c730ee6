"""rq's start and finish records of a task job travel as one script call each
(robot_lab/folded_writes.py): the same writes as a pipeline's, a failure still reported,
and a server without the script cached still gets every record."""

from __future__ import annotations


import fakeredis
import pytest

from robot_lab import folded_writes


def _stack(client, build):  # type: ignore[no-untyped-def]
    pipe = client.pipeline(transaction=False)
    build(pipe)
    return list(pipe.command_stack)


def test_folded_commands_run_in_order_and_a_failing_one_does_not_stop_the_rest(real_client, key_prefix) -> None:  # type: ignore[no-untyped-def]
    a, b, s = f"{key_prefix}:fold:a", f"{key_prefix}:fold:b", f"{key_prefix}:fold:s"
    real_client.set(s, "a string")
    real_client.script_load(folded_writes.APPLY)
    commands = _stack(real_client, lambda p: (p.hset(a, mapping={"x": "1", "y": 2}), p.expire(a, 60),
                                              p.hset(s, "f", "v"),  # WRONGTYPE: fails
                                              p.zadd(b, {"m": 1.5}), p.hincrby(a, "y", 3)))
    pipe = real_client.pipeline(transaction=False)
    assert folded_writes.queue(pipe, commands)
    assert len(pipe.command_stack) == 1  # one command for redis-py to pack and parse
    [reply] = pipe.execute(raise_on_error=False)
    assert isinstance(reply, Exception) and "WRONGTYPE" in str(reply)
    assert real_client.hgetall(a) == {b"x": b"1", b"y": b"5"} and 0 < real_client.ttl(a) <= 60
    assert real_client.zscore(b, "m") == 1.5 and real_client.get(s) == b"a string"
    assert not folded_writes.queue(pipe, [])  # nothing to fold: nothing queued


def test_every_key_a_command_names_is_declared(real_client) -> None:  # type: ignore[no-untyped-def]
    commands = _stack(real_client, lambda p: (p.hset("h", "f", "v"), p.expire("h", 5), p.delete("d1", "d2"),
                                              p.zadd("z", {"m": 1}), p.lrem("l", 1, "x")))
    keys, flat = folded_writes.flatten(commands)
    assert [k if isinstance(k, str) else k.decode() for k in keys] == ["h", "h", "d1", "d2", "z", "l"]
    assert flat[0] == 4 and flat[1:5] == ["HSET", "h", "f", "v"]
    pipe = real_client.pipeline(transaction=False)
    folded_writes.queue(pipe, commands)
    [(args, _)] = pipe.command_stack
    assert args[:3] == ("EVALSHA", folded_writes.APPLY_SHA, 6) and list(args[3:9]) == keys


def test_a_server_without_the_script_runs_none_of_them_and_gets_it_for_next_time() -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    commands = _stack(client, lambda p: p.set("k", "v"))
    pipe = client.pipeline(transaction=False)
    folded_writes.queue(pipe, commands)
    [reply] = pipe.execute(raise_on_error=False)
    assert folded_writes.missing(reply, client)  # NOSCRIPT: nothing ran ...
    assert client.get("k") is None
    assert client.script_exists(folded_writes.APPLY_SHA) == [True]  # ... and the script is loaded now
    folded_writes.queue(pipe, commands)
    [reply] = pipe.execute(raise_on_error=False)
    assert not folded_writes.missing(reply, client) and client.get("k") == b"v"


@pytest.mark.parametrize("cached", [False, True])
def test_the_in_flight_worker_leaves_rqs_records_whether_or_not_the_script_was_cached(cached, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A fresh server (no script cached: the first tasks' records go the plain way) and a warm
    one end with the same rq records: every job finished with its result, in the finished
    registry, nothing started, no execution left, the worker's count right."""
    from robot_lab.workers.inflight import in_flight_worker_class
    from tests.rq_records import network_rq_records

    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    if cached:
        client.script_load(folded_writes.APPLY)
    records = network_rq_records(client, in_flight_worker_class(), in_flight=4)
    assert records["statuses"] == ["finished"] * 4 and records["results"] == ["ok"] * 4
    assert records["ended"]  # started and ended by this worker
    assert records["finished"] and records["started"] == records["intermediate"] == records["executions"] == 0
    assert records["successful"] == 4
    assert client.script_exists(folded_writes.APPLY_SHA) == [True]
