"""Group commit of concurrent pipelines (robot_lab/coalesce.py) on a real Redis (and fakeredis)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from robot_lab import coalesce
from robot_lab.coalesce import Coalescer, RoundTripInterrupted, coalescer_for


class Interrupt(BaseException):
    """Stands in for an exception injected into the leading thread (rq's signal handler, a
    job timeout's watchdog)."""


def slow_client(client: Any, hold: threading.Event, *, fail: list[BaseException] | None = None) -> Any:
    """``client`` whose pipelines wait for ``hold`` before they run (so that other callers
    queue behind the first round trip), and raise the exceptions in ``fail`` first."""

    class Slow:
        def pipeline(self, transaction: bool = True) -> Any:
            pipe = client.pipeline(transaction=transaction)
            execute = pipe.execute

            def held(raise_on_error: bool = True) -> Any:
                hold.wait(10)
                if fail:
                    raise fail.pop(0)
                return execute(raise_on_error=raise_on_error)

            pipe.execute = held
            return pipe

    return Slow()


def run_threads(n: int, target: Any, group: Coalescer) -> tuple[list[threading.Thread], list[Any],
                                                                list[BaseException | None]]:
    """Caller 0 first, until its round trip is on the wire (held), then callers 1..n-1, until
    each of them waits in the queue."""
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def one(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - the test looks at each
            errors[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    threads[0].start()
    until(lambda: group.calls == 1 and not group._waiting)
    for t in threads[1:]:
        t.start()
    until(lambda: group.calls == n)
    return threads, results, errors


def until(condition: Any) -> None:
    for _ in range(3000):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("condition never held")


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a caller never got its replies"


def test_concurrent_pipelines_share_round_trips_and_each_gets_its_own_replies(redis_client: Any, key_prefix: str) -> None:
    hold = threading.Event()
    group = Coalescer(slow_client(redis_client, hold))
    n = 40

    def call(i: int) -> Any:
        pipe = redis_client.pipeline(transaction=False)
        pipe.set(f"{key_prefix}:k{i}", i)
        pipe.incrby(f"{key_prefix}:k{i}", 1000)
        pipe.get(f"{key_prefix}:k{i}")
        return group.execute(pipe)

    threads, results, errors = run_threads(n, call, group)  # every caller queued behind the first
    hold.set()
    join(threads)
    assert errors == [None] * n
    assert [r[1:] for r in results] == [[1000 + i, str(1000 + i).encode()] for i in range(n)]
    assert group.calls == n
    assert group.round_trips == 2  # the first caller's own, then the 39 that waited for it


def test_an_error_reply_reaches_only_its_caller(redis_client: Any, key_prefix: str) -> None:
    hold = threading.Event()
    group = Coalescer(slow_client(redis_client, hold))
    redis_client.set(f"{key_prefix}:text", "not a number")

    def call(i: int) -> Any:
        pipe = redis_client.pipeline(transaction=False)
        pipe.incr(f"{key_prefix}:text" if i == 2 else f"{key_prefix}:n{i}")
        pipe.get(f"{key_prefix}:n{i}")
        return group.execute(pipe, raise_on_error=i != 3)

    threads, results, errors = run_threads(5, call, group)
    hold.set()
    join(threads)
    assert isinstance(errors[2], redis.ResponseError) and "Command # 1 (INCR" in str(errors[2])
    assert [errors[i] for i in (0, 1, 3, 4)] == [None] * 4
    assert group.round_trips == 2  # the error reply came in the same round trip as others' replies
    assert results[0] == [1, b"1"] and results[4] == [1, b"1"]
    assert results[3] == [1, b"1"]
    assert results[1] == [1, b"1"]


def test_a_failed_round_trip_reaches_each_of_its_callers_and_the_next_one_works(redis_client: Any,
                                                                                 key_prefix: str) -> None:
    hold = threading.Event()
    hold.set()
    group = Coalescer(slow_client(redis_client, hold, fail=[redis.ConnectionError("gone")]))
    pipe = redis_client.pipeline(transaction=False)
    pipe.set(f"{key_prefix}:a", 1)
    with pytest.raises(redis.ConnectionError, match="gone"):
        group.execute(pipe)
    pipe.set(f"{key_prefix}:a", 2)
    assert group.execute(pipe) == [True]
    assert redis_client.get(f"{key_prefix}:a") == b"2"


def test_an_exception_of_the_leading_thread_is_its_own_and_a_connection_error_for_the_others(
        redis_client: Any, key_prefix: str) -> None:
    hold = threading.Event()
    group = Coalescer(slow_client(redis_client, hold, fail=[redis.ConnectionError("first"), Interrupt()]))
    n = 6

    def call(i: int) -> Any:
        pipe = redis_client.pipeline(transaction=False)
        pipe.incr(f"{key_prefix}:c{i}")
        return group.execute(pipe)

    threads, results, errors = run_threads(n, call, group)
    hold.set()
    join(threads)
    # round trip 1 (one caller) failed with "first"; round trip 2 (the other five) was cut by
    # an exception of its leader's own
    assert sum(isinstance(e, Interrupt) for e in errors) == 1
    interrupted = [e for e in errors if isinstance(e, RoundTripInterrupted)]
    assert len(interrupted) == 4 and all(isinstance(e, redis.ConnectionError) for e in interrupted)
    assert sum(isinstance(e, redis.ConnectionError) and "first" in str(e) for e in errors) == 1
    pipe = redis_client.pipeline(transaction=False)
    pipe.incr(f"{key_prefix}:after")
    assert group.execute(pipe) == [1]  # the lead was freed


def test_a_caller_interrupted_while_waiting_leaves_the_queue_and_passes_the_lead(
        redis_client: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coalesce, "LEAD_CHECK", 3600.0)  # nobody falls back on looking again
    hold = threading.Event()
    group = Coalescer(slow_client(redis_client, hold))
    doomed = threading.Event()
    wait = coalesce._Call.wait

    def interrupted_wait(self: Any, timeout: float) -> None:
        if threading.current_thread().name == "doomed":
            doomed.set()
            raise Interrupt()
        wait(self, timeout)

    monkeypatch.setattr(coalesce._Call, "wait", interrupted_wait)
    first = redis_client.pipeline(transaction=False)
    first.incr(f"{key_prefix}:lead")
    leader = threading.Thread(target=group.execute, args=(first,))
    leader.start()
    until(lambda: group.calls == 1 and not group._waiting)
    outcome: dict[str, Any] = {}

    def doomed_call() -> None:
        pipe = redis_client.pipeline(transaction=False)
        pipe.incr(f"{key_prefix}:doomed")
        try:
            group.execute(pipe)
        except Interrupt:
            outcome["doomed"] = "interrupted"

    def patient() -> None:
        pipe = redis_client.pipeline(transaction=False)
        pipe.incr(f"{key_prefix}:patient")
        outcome["patient"] = group.execute(pipe)

    d = threading.Thread(target=doomed_call, name="doomed")
    d.start()
    doomed.wait(10)
    p = threading.Thread(target=patient)
    p.start()
    until(lambda: group.calls == 3)
    hold.set()
    join([leader, d, p])
    assert outcome == {"doomed": "interrupted", "patient": [1]}
    assert redis_client.get(f"{key_prefix}:doomed") is None  # it left the queue before being sent


def test_only_plain_clients_coalesce(redis_client: Any) -> None:
    assert coalescer_for(redis_client) is coalescer_for(redis_client)
    assert coalescer_for(object()) is None
    transaction = redis_client.pipeline(transaction=True)
    transaction.ping()
    assert coalesce.execute(transaction, client=redis_client) == [True]  # run on its own: MULTI/EXEC kept
    plain = coalesce.pipeline(redis_client)
    plain.ping()
    assert coalesce.execute(plain) == [True]
    assert coalescer_for(redis_client).calls == 1


# --- one command: coalesce.call / coalesce.script ------------------------------------------
def held_group(redis_client: Any, monkeypatch: pytest.MonkeyPatch, hold: threading.Event) -> Coalescer:
    """A group commit for ``redis_client`` (as ``coalescer_for`` hands out) whose round trips
    wait for ``hold``; its first caller's pipeline is on the wire when this returns."""
    group = Coalescer(slow_client(redis_client, hold))
    monkeypatch.setitem(coalesce._coalescers, redis_client, group)
    first = redis_client.pipeline(transaction=False)
    first.ping()
    leader = threading.Thread(target=group.execute, args=(first,), daemon=True)
    leader.start()
    until(lambda: group.calls == 1 and not group._waiting and group._leading)
    return group


def test_single_commands_behind_a_round_trip_on_the_wire_share_the_next_one(
        redis_client: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hold = threading.Event()
    group = held_group(redis_client, monkeypatch, hold)
    redis_client.set(f"{key_prefix}:text", "not a number")
    n = 12
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def one(i: int) -> None:
        try:
            if i == 3:  # an error reply: the command's own exception, not a pipeline's
                results[i] = coalesce.call(redis_client, "incr", f"{key_prefix}:text")
            elif i % 2:
                results[i] = coalesce.call(redis_client, "set", f"{key_prefix}:s{i}", i, nx=True, ex=60)
            else:
                results[i] = coalesce.call(redis_client, "hgetall", f"{key_prefix}:none{i}")
        except BaseException as exc:  # noqa: BLE001
            errors[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    until(lambda: group.calls == n + 1)  # every one queued behind the round trip on the wire
    hold.set()
    join(threads)
    assert group.round_trips == 2  # the first caller's own, then all twelve together
    assert isinstance(errors[3], redis.ResponseError) and not str(errors[3]).startswith("Command #")
    assert [errors[i] for i in range(n) if i != 3] == [None] * (n - 1)
    assert [results[i] for i in range(1, n, 2) if i != 3] == [True] * 5  # SET's own reply type
    assert [results[i] for i in range(0, n, 2)] == [{}] * 6  # HGETALL's: the response callback ran
    assert redis_client.ttl(f"{key_prefix}:s1") > 0


def test_a_lone_command_goes_out_as_a_plain_command_holding_the_lead(
        redis_client: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    group = Coalescer(redis_client)
    monkeypatch.setitem(coalesce._coalescers, redis_client, group)
    seen: list[bool] = []
    real = redis_client.execute_command

    def spy(*args: Any, **options: Any) -> Any:
        seen.append(group._leading)  # others arriving now queue behind it
        return real(*args, **options)

    monkeypatch.setattr(redis_client, "execute_command", spy)
    assert coalesce.call(redis_client, "set", f"{key_prefix}:lone", "x") is True
    assert coalesce.call(redis_client, "get", f"{key_prefix}:lone") == b"x"
    assert seen == [True, True] and group.calls == 0 and not group._leading
    with pytest.raises(redis.ResponseError):
        coalesce.call(redis_client, "incr", f"{key_prefix}:lone")
    assert not group._leading  # freed after an error too
    assert coalesce.call(object.__new__(FakeClient), "get", "k") == "plain"  # not a redis.Redis


class FakeClient:
    def get(self, key: str) -> str:
        return "plain"


def test_scripts_behind_a_round_trip_share_the_next_one_and_an_unknown_script_loads_itself(
        redis_client: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    known = redis_client.register_script("return {KEYS[1], ARGV[1]}")
    known(keys=["k"], args=["warm"])  # loaded
    unknown = redis_client.register_script(f"-- {uuid.uuid4()}\nreturn redis.call('INCR', KEYS[1])")
    failing = redis_client.register_script("return redis.error_reply('NOPE no')")
    hold = threading.Event()
    group = held_group(redis_client, monkeypatch, hold)
    out: dict[str, Any] = {}

    def run(name: str, lua: Any, keys: list[Any], args: list[Any]) -> None:
        try:
            out[name] = coalesce.script(lua, keys, args)
        except BaseException as exc:  # noqa: BLE001
            out[name] = exc

    threads = [threading.Thread(target=run, args=("known", known, [f"{key_prefix}:a"], ["x"])),
               threading.Thread(target=run, args=("unknown", unknown, [f"{key_prefix}:n"], [])),
               threading.Thread(target=run, args=("failing", failing, [], []))]
    for t in threads:
        t.start()
    until(lambda: group.calls == 4)
    hold.set()
    join(threads)
    assert out["known"] == [f"{key_prefix}:a".encode(), b"x"]
    assert out["unknown"] == 1 and redis_client.get(f"{key_prefix}:n") == b"1"  # ran once: NOSCRIPT ran nothing
    assert isinstance(out["failing"], redis.ResponseError) and "NOPE" in str(out["failing"])
    assert group.round_trips == 2
