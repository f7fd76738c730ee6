"""Memory on both backends (fakeredis with Lua, and a real Redis): API, change records,
blocking reads, subscriptions and their catch-up from the change stream.

Everything here runs in one process; tests/test_memory_procs.py covers real
subprocesses.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from robot_lab import AwaitTimeout, Memory, MemoryValueError, ReservedKeyError
from robot_lab.errors import ConfigurationError, RobotLabError, SchemaError
from robot_lab.keys import Keys, default_keys
from robot_lab.memory.store import BROADCAST_KEY
from robot_lab.schemas import MemoryChange, RobotResult, TextMessage
from tests.redis_server import wait_for


@pytest.fixture
def scope() -> str:
    return f"test:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def mem(redis_client: Any, scope: str) -> Iterator[Memory]:
    memory = Memory(scope, redis=redis_client, poll_interval=0.1)
    yield memory
    memory.close()


def other(mem: Memory, **kwargs: Any) -> Memory:
    """A second Memory on the same scope, as another process would have."""
    return Memory(mem.scope, redis=mem.redis, **kwargs)


class _SilentKeys(Keys):
    """The same layout, but notifications go to a channel nobody listens on."""

    __slots__ = ()

    def memory_channel(self, scope: str) -> str:
        return f"{super().memory_channel(scope)}:nobody"


def silent(mem: Memory) -> Memory:
    """A writer on the same scope whose pub/sub notifications are lost (the stream still has them)."""
    return Memory(mem.scope, redis=mem.redis, keys=_SilentKeys(mem.keys_layout.prefix, mem.keys_layout.cluster))


# --- basic API ---------------------------------------------------------------------------


def test_set_get_brackets_and_json_round_trip(mem: Memory) -> None:
    assert mem.set("a", {"x": [1, 2.5, "s", None, True]}) == {"x": [1, 2.5, "s", None, True]}
    mem["b"] = "text"
    assert mem.get("a") == {"x": [1, 2.5, "s", None, True]}
    assert mem["b"] == "text"
    assert mem["missing"] is None
    # Another instance (another process) sees the same values.
    assert other(mem).get("a", "b") == {"a": {"x": [1, 2.5, "s", None, True]}, "b": "text"}


def test_get_several_keys_returns_dict_in_order(mem: Memory) -> None:
    mem.merge({"k1": 1, "k2": 2})
    assert list(mem.get("k2", "nope", "k1").items()) == [("k2", 2), ("nope", None), ("k1", 1)]
    with pytest.raises(ConfigurationError):
        mem.get()


def test_stored_null_exists(mem: Memory) -> None:
    mem["n"] = None
    assert "n" in mem and mem.has_key("n") and mem.include("n")
    assert "other" not in mem
    assert mem.get("n", wait=0.01) is None  # a stored null satisfies a waiter
    assert mem.keys() == ["n"]


def test_keys_leave_out_reserved_and_reserved_always_exist(mem: Memory) -> None:
    mem.merge({"z": 1, "a": 2, "data": {"q": 1}, "session_id": "s-1"})
    assert mem.keys() == ["a", "z"]
    assert list(mem) == ["a", "z"] and len(mem) == 2
    assert mem.all_keys() == ["a", "data", "messages", "results", "session_id", "z"]
    fresh = Memory(f"{mem.scope}-empty", redis=mem.redis)
    assert all(k in fresh for k in Memory.RESERVED_KEYS)
    assert fresh.get("results", "messages", "data", "session_id") == {
        "results": [], "messages": [], "data": {}, "session_id": None}


def test_delete_returns_value_and_records_a_deleted_change(mem: Memory) -> None:
    mem["gone"] = {"v": 1}
    version = mem.version
    assert mem.delete("gone") == {"v": 1}
    assert "gone" not in mem
    change = mem.changes(version)[0]
    assert (change.op, change.key, change.value, change.previous, change.version) == (
        "deleted", "gone", None, {"v": 1}, version + 1)
    assert change.deleted and not change.created
    assert mem.delete("gone") is None
    assert mem.version == version + 1  # deleting a missing key records nothing


@pytest.mark.parametrize("key", ["data", "results", "messages", "session_id"])
def test_reserved_keys_cannot_be_deleted(mem: Memory, key: str) -> None:
    with pytest.raises(ReservedKeyError, match=f"cannot delete reserved key '{key}'"):
        mem.delete(key)
    with pytest.raises(ReservedKeyError):
        del mem[key]


def test_clear_removes_custom_keys_only(mem: Memory) -> None:
    mem.merge({"a": 1, "b": 2, "session_id": "keep", "data": {"x": 1}})
    before = mem.version
    assert mem.clear() == 2
    assert mem.keys() == []
    assert mem.session_id == "keep" and mem.data.x == 1
    changes = mem.changes(before)
    assert sorted(c.key for c in changes) == ["a", "b"]
    assert all(c.op == "deleted" for c in changes)
    assert [c.version for c in changes] == [before + 1, before + 2]


def test_reset_reseeds_reserved_keys(mem: Memory) -> None:
    mem.merge({"a": 1, "session_id": "s", "data": {"x": 1}})
    mem.reset()
    assert mem.to_dict() == {"data": {}, "results": [], "messages": [], "session_id": None, "custom": {}}


def test_merge_is_one_version_per_key_in_order(mem: Memory) -> None:
    start = mem.version
    mem.merge({"m1": 1, "m2": [2], "m3": {"three": 3}})
    assert mem.version == start + 3
    assert [(c.key, c.value, c.version) for c in mem.changes(start)] == [
        ("m1", 1, start + 1), ("m2", [2], start + 2), ("m3", {"three": 3}, start + 3)]


def test_to_dict_and_from_dict_round_trip(mem: Memory, scope: str) -> None:
    mem.merge({"c1": 1, "data": {"d": 1}, "session_id": "sid"})
    mem.append_result(RobotResult(robot_name="r1", output=[TextMessage(content="hi")]))
    exported = mem.to_dict()
    assert exported["custom"] == {"c1": 1}
    copy = Memory.from_dict(exported, f"{scope}-copy", redis=mem.redis)
    assert copy.to_dict() == exported


# --- bad input ---------------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize("value", [Opaque(), {"nested": {"deep": Opaque()}}, [1, lambda: 2], {(1, 2): "tuple key"}])
def test_unserializable_values_raise_naming_the_key_and_write_nothing(mem: Memory, value: Any) -> None:
    version = mem.version
    with pytest.raises(MemoryValueError, match="key 'bad'") as info:
        mem.set("bad", value)
    assert isinstance(info.value, SchemaError) and isinstance(info.value, TypeError)
    assert info.value.path == "$.bad"
    with pytest.raises(MemoryValueError, match="key 'bad'"):
        mem.merge({"fine": 1, "bad": value})
    assert "bad" not in mem and "fine" not in mem  # merge validates everything first
    assert mem.version == version


@pytest.mark.parametrize("key", [("t", 1), 7, b"bytes", "", None])
def test_bad_keys_raise_naming_the_key(mem: Memory, key: Any) -> None:
    with pytest.raises(MemoryValueError, match=repr(key).replace("(", r"\(").replace(")", r"\)")):
        mem.set(key, 1)
    with pytest.raises(MemoryValueError):
        mem.get(key)
    assert mem.version == 0


def test_reserved_values_are_validated(mem: Memory) -> None:
    with pytest.raises(MemoryValueError, match="'data' must be a mapping"):
        mem.set("data", [1, 2])
    with pytest.raises(MemoryValueError, match="'results' must be a list"):
        mem.results = "nope"  # type: ignore[assignment]
    with pytest.raises(MemoryValueError, match="'results': invalid RobotResult"):
        mem.append_result({"no_robot_name": True})
    with pytest.raises(MemoryValueError, match="'messages'"):
        mem.append_message({"type": "text", "role": "nobody"})
    assert mem.version == 0


def test_bad_arguments(mem: Memory, redis_client: Any) -> None:
    with pytest.raises(ConfigurationError, match="scope"):
        Memory("", redis=redis_client)
    with pytest.raises(ConfigurationError, match="wait"):
        mem.get("k", wait=-1)
    with pytest.raises(ConfigurationError, match="callback"):
        mem.subscribe("k")
    with pytest.raises(ConfigurationError, match="at least one key"):
        mem.subscribe(callback=print)
    with pytest.raises(ConfigurationError, match="since_version"):
        mem.subscribe("k", print, since_version=-3)


# --- reserved keys -------------------------------------------------------------------------


def test_data_proxy_reads_and_writes_through(mem: Memory) -> None:
    mem.data.category = "billing"
    other(mem).data["priority"] = 2
    assert mem.data.category == "billing" and mem.data.priority == 2
    assert mem.data.unknown is None
    assert mem.data == {"category": "billing", "priority": 2}
    assert "category" in mem.data and sorted(mem.data) == ["category", "priority"]
    mem.data.update(a=1)
    del mem.data.category
    assert mem.get("data") == {"priority": 2, "a": 1}
    mem.data = {"replaced": True}
    assert mem.data.to_dict() == {"replaced": True}


def test_results_messages_and_session_id(mem: Memory) -> None:
    result = RobotResult(robot_name="writer", output=[TextMessage(content="draft")])
    mem.append_result(result)
    mem.append_result(result.export() | {"robot_name": "editor"})
    results = mem.results
    assert [r.robot_name for r in results] == ["writer", "editor"]
    assert results[0].reply == "draft"
    results.append(result)  # a copy: the stored list is unchanged
    assert len(mem.results) == 2
    assert [r.robot_name for r in mem.results_from(1)] == ["editor"]
    mem.append_message({"role": "user", "content": "hello"})
    mem.append_message(TextMessage(role="assistant", content="hi"))
    assert mem.messages == [TextMessage(role="user", content="hello"), TextMessage(role="assistant", content="hi")]
    mem.session_id = "abc"
    assert other(mem).session_id == "abc"


# --- change records --------------------------------------------------------------------------


def test_each_write_records_a_versioned_change(redis_client: Any, scope: str) -> None:
    mem = Memory.for_run(scope, redis=redis_client, network_name="support")
    mem.current_writer = "classifier"
    mem["k"] = 1
    with mem.writing_as("billing"):
        mem["k"] = 2
    mem.update("k", lambda v: v + 1)
    changes = mem.changes()
    assert [(c.version, c.value, c.previous, c.writer) for c in changes] == [
        (1, 1, None, "classifier"), (2, 2, 1, "billing"), (3, 3, 2, "classifier")]
    assert all(c.scope == f"run:{scope}" and c.network_name == "support" and c.key == "k" for c in changes)
    assert all(c.timestamp > 1e9 for c in changes)
    assert changes[0].created and changes[1].updated
    assert mem.version == 3
    assert mem.changes(1, limit=1)[0].version == 2


def test_scope_constructors_and_key_layout(redis_client: Any) -> None:
    keys = default_keys()
    run = Memory.for_run("r1", redis=redis_client, network_name="net")
    assert (run.scope, run.network_name) == ("run:r1", "net")
    robot = Memory.for_robot("billing", redis=redis_client)
    assert (robot.scope, robot.current_writer) == ("robot:billing", "billing")
    network = Memory.for_network("support", redis=redis_client)
    assert (network.scope, network.network_name) == ("network:support", "support")
    run["x"] = 1
    assert redis_client.hget(keys.memory("run:r1"), "x") == b"1"
    assert int(redis_client.get(keys.memory_version("run:r1"))) == 1
    assert redis_client.xlen(keys.memory_changes("run:r1")) == 1
    assert robot.get("x") is None  # scopes don't leak into each other
    run.destroy()
    assert redis_client.exists(keys.memory("run:r1"), keys.memory_version("run:r1")) == 0


def test_change_stream_is_capped(redis_client: Any, scope: str) -> None:
    mem = Memory(scope, redis=redis_client, changes_maxlen=10)
    for i in range(400):
        mem["k"] = i
    length = redis_client.xlen(default_keys().memory_changes(scope))
    assert 10 <= length < 400  # approximate trimming keeps whole stream nodes
    assert mem.version == 400 and mem["k"] == 399


def test_expire_sets_a_ttl_on_every_key(mem: Memory, redis_client: Any) -> None:
    mem["k"] = 1
    mem.expire(100)
    keys = default_keys()
    for key in (keys.memory(mem.scope), keys.memory_version(mem.scope), keys.memory_changes(mem.scope)):
        assert 0 < redis_client.ttl(key) <= 100


# --- blocking reads --------------------------------------------------------------------------


def test_wait_on_key_written_before_returns_at_once(mem: Memory) -> None:
    mem["ready"] = {"ok": True}
    assert mem.get("ready", wait=True) == {"ok": True}
    assert mem.get("ready", wait=0) == {"ok": True}
    assert mem.get("data", wait=True) == {}  # reserved keys always exist


def test_wait_timeout_raises_await_timeout(mem: Memory) -> None:
    with pytest.raises(AwaitTimeout, match=r"^Timeout waiting for :answer after 0.2 seconds$") as info:
        mem.get("answer", wait=0.2)
    assert info.value.keys == ["answer"]  # type: ignore[attr-defined]
    with pytest.raises(AwaitTimeout, match=r"^Timeout waiting for :answer after 0 seconds$"):
        mem.get("answer", wait=0)


def test_multi_key_wait_has_one_overall_deadline(mem: Memory) -> None:
    mem["b"] = 2
    started = time.monotonic()
    with pytest.raises(AwaitTimeout, match=r"Timeout waiting for :a, :c after 0.4 seconds"):
        mem.get("a", "b", "c", wait=0.4)
    # Sequential waits (robot_lab) would take 2 x 0.4 s for the two missing keys.
    assert time.monotonic() - started < 0.8


def test_blocking_read_is_woken_by_another_writer(mem: Memory) -> None:
    writer = other(mem)
    result: dict[str, Any] = {}

    def reader() -> None:
        result["value"] = mem.get("signal", wait=10)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        wait_for(lambda: mem._listener is not None and mem._listener.waiters.get("signal"), 5)
        writer["signal"] = [1, 2, 3]
    finally:
        thread.join(10)
    assert result["value"] == [1, 2, 3]


def test_wait_for_several_keys_is_woken_as_they_arrive(mem: Memory) -> None:
    writer = other(mem)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(mem.get("x", "y", "z", wait=10)))
    thread.start()
    try:
        wait_for(lambda: mem._listener is not None and mem._listener.waiters.get("x"), 5)
        writer["y"] = None
        writer["x"] = 1
        writer.delete("y")  # once seen, a key stays satisfied
        writer["z"] = "last"
    finally:
        thread.join(10)
    assert result == {"x": 1, "y": None, "z": "last"}


def test_wait_forever_is_woken(mem: Memory) -> None:
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("v", mem.get("late", wait=True)))
    thread.start()
    try:
        wait_for(lambda: mem._listener is not None and mem._listener.waiters.get("late"), 5)
        other(mem).set("late", 0)
    finally:
        thread.join(10)
    assert result == {"v": 0}


def test_close_releases_blocked_waiters(mem: Memory) -> None:
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            mem.get("never", wait=30)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    wait_for(lambda: mem._listener is not None and mem._listener.waiters.get("never"), 5)
    mem.close()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(errors[0], RobotLabError) and "closed" in str(errors[0])
    # The memory still works, and a new wait starts a new listener.
    mem["never"] = 1
    assert mem.get("never", wait=1) == 1


# --- subscriptions ----------------------------------------------------------------------------


def test_subscribe_delivers_changes_in_version_order(mem: Memory) -> None:
    got: list[MemoryChange] = []
    sub_id = mem.subscribe("a", "b", got.append)  # callback positional, last
    writer = other(mem)
    writer["a"] = 1
    writer["ignored"] = 0
    writer["b"] = 2
    writer["a"] = 3
    writer.delete("a")
    wait_for(lambda: len(got) == 4, 5)
    assert [(c.key, c.op, c.value, c.previous) for c in got] == [
        ("a", "set", 1, None), ("b", "set", 2, None), ("a", "set", 3, 1), ("a", "deleted", None, 3)]
    assert [c.version for c in got] == sorted(c.version for c in got)
    assert mem.subscribed("a") and not mem.subscribed("ignored")
    assert mem.unsubscribe(sub_id) is True
    assert mem.unsubscribe(sub_id) is False
    writer["a"] = 5
    marker: list[MemoryChange] = []
    mem.subscribe("marker", callback=marker.append)
    writer["marker"] = 1
    wait_for(lambda: marker, 5)
    assert len(got) == 4  # nothing after unsubscribe


def test_subscribe_pattern_uses_robot_lab_globs(mem: Memory) -> None:
    got: list[str] = []
    mem.subscribe_pattern("task_?.*", lambda c: got.append(c.key))
    for key in ("task_1.out", "task_22.out", "task_x.", "xtask_1.out", "task_1"):
        mem[key] = 1
    mem["task_9.done"] = 1
    wait_for(lambda: "task_9.done" in got, 5)
    assert got == ["task_1.out", "task_x.", "task_9.done"]


def test_unsubscribe_keys(mem: Memory) -> None:
    got: list[str] = []
    mem.subscribe("a", "b", lambda c: got.append(c.key))
    assert mem.unsubscribe_keys("a") == 0  # still subscribed to b
    assert not mem.subscribed("a") and mem.subscribed("b")
    mem["a"] = 1
    mem["b"] = 1
    wait_for(lambda: got, 5)
    assert got == ["b"]
    assert mem.unsubscribe_keys("b") == 1
    assert not mem.subscribed("b")


def test_since_version_replays_then_goes_live(mem: Memory) -> None:
    for i in range(5):
        mem["k"] = i
    got: list[int] = []
    mem.subscribe("k", lambda c: got.append(c.value), since_version=2)
    assert got == [2, 3, 4]  # the backlog is replayed before subscribe returns
    mem["k"] = 5
    wait_for(lambda: len(got) == 4, 5)
    assert got == [2, 3, 4, 5]


def test_durable_subscriber_resumes_after_its_last_version(redis_client: Any, scope: str) -> None:
    writer = Memory(scope, redis=redis_client)
    first = Memory(scope, redis=redis_client, poll_interval=0.1)
    got: list[int] = []
    first.subscribe("k", lambda c: got.append(c.value), subscriber_id="auditor")
    writer["k"] = 0
    writer["k"] = 1
    wait_for(lambda: len(got) == 2, 5)
    wait_for(lambda: first.cursor("auditor") == 2, 5)
    first.close()
    for i in range(2, 6):
        writer["k"] = i  # written while the subscriber is away
    second = Memory(scope, redis=redis_client, poll_interval=0.1)
    try:
        second.subscribe("k", lambda c: got.append(c.value), subscriber_id="auditor")
        writer["k"] = 6
        wait_for(lambda: len(got) == 7, 5)
        assert got == list(range(7))
        wait_for(lambda: second.cursor("auditor") == 7, 5)  # written just after the callback
    finally:
        second.close()


def test_transactional_subscriber_commits_effects_with_its_cursor(mem: Memory, redis_client: Any) -> None:
    out = f"{default_keys().prefix}:test:out"

    def record(change: MemoryChange, pipe: Any) -> None:
        pipe.rpush(out, f"{change.version}:{change.value}")

    mem.subscribe("k", record, subscriber_id="tx", transactional=True)
    for i in range(3):
        other(mem)["k"] = i
    wait_for(lambda: redis_client.llen(out) == 3, 5)
    assert redis_client.lrange(out, 0, -1) == [b"1:0", b"2:1", b"3:2"]
    wait_for(lambda: mem.cursor("tx") == 3, 5)


def test_a_failing_callback_is_logged_and_delivery_goes_on(mem: Memory) -> None:
    got: list[int] = []

    def flaky(change: MemoryChange) -> None:
        if change.value == 1:
            raise RuntimeError("boom")
        got.append(change.value)

    mem.subscribe("k", flaky, subscriber_id="flaky")
    for i in range(3):
        mem["k"] = i
    wait_for(lambda: len(got) == 2, 5)
    assert got == [0, 2]
    wait_for(lambda: mem.cursor("flaky") == 3, 5)


def test_lost_notifications_are_caught_up_from_the_stream(redis_client: Any, scope: str) -> None:
    """Writes whose pub/sub message never arrives are read from the change stream as soon as
    a later notification shows the gap: no change is skipped, none is repeated."""
    subscriber = Memory(scope, redis=redis_client, poll_interval=60)  # no idle polling
    got: list[int] = []
    subscriber.subscribe("k", lambda c: got.append(c.value))
    writer = silent(subscriber)  # its notifications are lost
    try:
        for i in range(3):
            writer["k"] = i
        Memory(scope, redis=redis_client)["k"] = 3
        wait_for(lambda: len(got) == 4, 5)
        assert got == [0, 1, 2, 3]
    finally:
        subscriber.close()


def test_idle_poll_catches_a_lost_last_notification(mem: Memory, redis_client: Any) -> None:
    got: list[int] = []
    mem.subscribe("k", lambda c: got.append(c.value))
    silent(mem)["k"] = 42
    wait_for(lambda: got, 5)  # found by the version poll (poll_interval=0.1)
    assert got == [42]


def test_trimmed_changes_are_reported_and_delivery_continues(redis_client: Any, scope: str) -> None:
    writer = Memory(scope, redis=redis_client, changes_maxlen=1)
    for i in range(300):
        writer["k"] = i
    mem = Memory(scope, redis=redis_client)
    got: list[int] = []
    try:
        mem.subscribe("k", lambda c: got.append(c.value), since_version=0)
        assert mem.lost_changes > 0
        assert got == list(range(300 - len(got), 300))  # what the stream still held, in order
        writer["k"] = 300
        wait_for(lambda: got[-1] == 300, 5)
    finally:
        mem.close()


def test_broadcast_reaches_on_broadcast_handlers(redis_client: Any, scope: str) -> None:
    network = Memory.for_run(scope, redis=redis_client, network_name="writers_room")
    listener = Memory.for_run(scope, redis=redis_client)
    got: list[Any] = []
    try:
        listener.on_broadcast(got.append)
        sent = network.broadcast({"chapter": 3, "status": "done"})
        wait_for(lambda: got, 5)
        assert got == [sent]
        assert sent["payload"] == {"chapter": 3, "status": "done"} and sent["network"] == "writers_room"
        assert network.get(BROADCAST_KEY) == sent
    finally:
        listener.close()


# --- compare-and-set -------------------------------------------------------------------------


def test_update_from_many_threads_loses_no_increment(mem: Memory) -> None:
    def work() -> None:
        mine = other(mem)
        for _ in range(50):
            mine.update("counter", lambda v: (v or 0) + 1)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert mem["counter"] == 300
    assert [c.value for c in mem.changes()] == list(range(1, 301))


def test_update_uses_default_and_writes_nothing_when_fn_fails(mem: Memory) -> None:
    assert mem.update("list", lambda v: [*v, "a"], default=[]) == ["a"]

    def boom(_: Any) -> Any:
        raise ValueError("no")

    version = mem.version
    with pytest.raises(ValueError):
        mem.update("list", boom)
    with pytest.raises(MemoryValueError, match="key 'list'"):
        mem.update("list", lambda v: Opaque())
    assert mem.version == version and mem["list"] == ["a"]


def test_update_retries_on_conflict(mem: Memory) -> None:
    calls: list[Any] = []
    intruder = other(mem)

    def fn(value: Any) -> Any:
        calls.append(value)
        if len(calls) == 1:
            intruder["c"] = 10  # someone else writes between our read and our write
        return (value or 0) + 1

    mem["c"] = 1
    assert mem.update("c", fn) == 11
    assert calls == [1, 10]
    assert mem["c"] == 11


# --- networks and robustness ------------------------------------------------------------------


def test_resolve_memory_follows_robot_lab_run_rules(redis_client: Any, scope: str) -> None:
    from robot_lab import resolve_memory

    run = Memory.for_run(scope, redis=redis_client, network_name="net")
    assert resolve_memory(None, run) is run
    merged = resolve_memory({"topic": "billing"}, run)  # run(memory={...}) merges
    assert merged is run and run["topic"] == "billing"
    own = Memory.for_robot("solo", redis=redis_client)
    assert resolve_memory(own, run) is own  # run(memory=Memory) replaces
    named = resolve_memory("team-notes", run)  # a task naming another scope
    assert (named.scope, named.network_name, named.redis) == ("team-notes", "net", redis_client)
    with pytest.raises(ConfigurationError, match="got int"):
        resolve_memory(3, run)  # type: ignore[arg-type]


def test_junk_on_the_channel_is_ignored(mem: Memory, redis_client: Any) -> None:
    got: list[int] = []
    mem.subscribe("k", lambda c: got.append(c.value))
    redis_client.publish(mem.keys_layout.memory_channel(mem.scope), b"not json")
    redis_client.publish(mem.keys_layout.memory_channel(mem.scope), b'{"key": 1}')
    mem["k"] = 1
    wait_for(lambda: got, 5)
    assert got == [1]


def test_callback_cannot_block_on_its_own_memory(mem: Memory) -> None:
    errors: list[str] = []

    def blocking(change: MemoryChange) -> None:
        try:
            mem.get("other", wait=1)
        except RobotLabError as exc:
            errors.append(str(exc))

    mem.subscribe("k", blocking)
    mem["k"] = 1
    wait_for(lambda: errors, 5)
    assert "cannot block" in errors[0]


def test_idle_listener_retires_and_restarts_on_demand(redis_client: Any, scope: str) -> None:
    mem = Memory(scope, redis=redis_client, poll_interval=0.05, listener_idle_timeout=0.2)
    try:
        mem["there"] = 1
        assert mem.get("there", wait=1) == 1  # starts a listener
        first = mem._listener
        assert first is not None
        wait_for(lambda: mem._listener is None and not first.is_alive(), 5)  # nobody waits: it exits
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.setdefault("v", mem.get("later", wait=10)))
        thread.start()
        try:
            wait_for(lambda: mem._listener is not None and mem._listener.waiters.get("later"), 5)
            other(mem)["later"] = "woken"
        finally:
            thread.join(10)
        assert result == {"v": "woken"}
        got: list[int] = []
        mem.subscribe("k", lambda c: got.append(c.value))
        time.sleep(0.5)  # longer than the idle timeout: a subscription keeps the listener
        other(mem)["k"] = 7
        wait_for(lambda: got, 5)
        assert got == [7] and mem._listener is not None and mem._listener.is_alive()
    finally:
        mem.close()


def test_default_client_and_key_layout_come_from_settings(redis_client: Any, scope: str, key_prefix: str) -> None:
    """No ``redis=``: embedded fakeredis without REDIS_URL, the real server with it."""
    mem = Memory(scope)
    mem["k"] = {"v": 1}
    assert redis_client.hget(f"{key_prefix}:mem:{scope}", "k") == b'{"v":1}'
    assert Memory(scope).get("k") == {"v": 1}


def test_local_write_count_moves_with_every_kind_of_write_and_not_with_reads(mem: Memory) -> None:
    """A network task compares this count before and after its robot ran to decide whether
    it has memory.changed events to report (robot_lab/network/task_job.py)."""
    from robot_lab.memory.values import local_writes

    counts = [local_writes(mem.scope)]
    for write in (lambda: mem.set("a", 1), lambda: mem.merge({"b": 2}), lambda: mem.update("a", lambda v: v + 1),
                  lambda: mem.delete("b"), mem.clear, mem.reset):
        write()
        counts.append(local_writes(mem.scope))
    assert all(later > earlier for earlier, later in zip(counts, counts[1:]))
    mem.get("a"), mem.keys(), mem.version
    assert local_writes(mem.scope) == counts[-1]
    assert local_writes(f"{mem.scope}-other") == 0
