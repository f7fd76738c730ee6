"""Every Lua script of robot-lab declares every key it touches in KEYS (Redis Cluster's rule).

Redis 7 executes a script that reaches an undeclared key *of the same slot*, so a real
cluster alone would not catch a script that builds a sibling key name from ``KEYS[1]``
(hash tags put the siblings in the slot). Two checks instead:

* static: no script concatenates onto a key (``KEYS[n] ..``, an alias of a KEYS entry, or a
  ``':suffix'`` literal);
* dynamic, on the real cluster: MONITOR on every primary while every script runs; each
  command a script executes (``[0 lua]`` lines) may name only keys its EVALSHA declared
  (``COMMAND GETKEYS`` says which arguments are keys).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from typing import Any

import pytest
import redis

from robot_lab.bus import stream_scripts as bus_scripts
from robot_lab.memory import lua as memory_lua
from robot_lab.network import human_input as waiting
from robot_lab.network import transitions
from robot_lab.runtime.rails.budget import ledger_scripts as budget_scripts
from tests.worker_procs import uid


def _all_scripts() -> dict[str, str]:
    out = {}
    for module in (bus_scripts, memory_lua, transitions, waiting, budget_scripts):
        for name, value in vars(module).items():
            if name.isupper() and not name.startswith("_") and isinstance(value, str) and "redis.call" in value:
                out[f"{module.__name__}.{name}"] = value
    return out


def test_there_are_scripts_to_check() -> None:
    assert len(_all_scripts()) >= 25


@pytest.mark.parametrize("name", sorted(_all_scripts()))
def test_no_script_builds_a_key_name(name: str) -> None:
    source = _all_scripts()[name]
    aliases = set()
    for names, values in re.findall(r"local\s+([\w\s,]+?)\s*=\s*((?:KEYS\[\d+\]\s*,?\s*)+)", source):
        aliases.update(n.strip() for n in names.split(","))
    assert not re.search(r"KEYS\[[^\]]+\]\s*\.\.", source), "concatenates onto KEYS[...]"
    for alias in aliases:
        assert not re.search(rf"\b{alias}\s*\.\.", source), f"concatenates onto {alias} (a KEYS entry)"
    assert not re.search(r"\.\.\s*'(:[A-Za-z_-]+)", source), "builds a ':suffix' key name"


# --- the dynamic audit -----------------------------------------------------------------------

_ARG = re.compile(r'"((?:\\.|[^"\\])*)"')
_ESC = re.compile(r"\\(x[0-9a-fA-F]{2}|.)")


def _unquote(arg: str) -> bytes:
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e.startswith("x"):
            return chr(int(e[1:], 16))
        return {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b"}.get(e, e)

    return _ESC.sub(one, arg).encode("latin-1")


class Monitor:
    """Raw MONITOR lines of one node, parsed into (source, args)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lines: list[tuple[str, list[bytes]]] = []
        self._client = redis.Redis(port=port)
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self._token = f"stop-monitor-{uid()}".encode()
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = self._monitor.connection
        while True:
            try:
                raw = conn.read_response()  # blocking: a read timeout would drop the connection
            except Exception as exc:  # noqa: BLE001
                self.error = exc
                return
            line = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
            match = re.match(r"[\d.]+ \[\d+ ([^\]]+)\] (.*)$", line, re.S)
            if not match:
                continue
            args = [_unquote(a) for a in _ARG.findall(match.group(2))]
            if args[:2] == [b"ECHO", self._token]:
                return
            self.lines.append((match.group(1), args))

    def stop(self) -> None:
        """Ends the reader with an ECHO of a token only it waits for (MONITOR shows it)."""
        self._client.echo(self._token)
        self._thread.join(5)
        self._monitor.__exit__(None, None, None)


def _violations(port: int, lines: list[tuple[str, list[bytes]]]) -> tuple[int, list[str]]:
    """(number of script commands checked, the ones naming an undeclared key)."""
    client = redis.Redis(port=port)
    declared: set[bytes] = set()
    checked, bad = 0, []
    for source, args in lines:
        if not args:
            continue
        cmd = args[0].upper()
        if source != "lua":
            if cmd in (b"EVAL", b"EVALSHA"):
                n = int(args[2])
                declared = set(args[3:3 + n])
            continue
        try:
            keys = client.command_getkeys(*args)
        except redis.ResponseError:
            keys = []  # a command without keys (TIME, PUBLISH)
        checked += 1
        for key in keys:
            key = key.encode("latin-1") if isinstance(key, str) else key
            if key not in declared:
                bad.append(f"{args[0].decode()} {key!r} not in KEYS {sorted(declared)}")
    return checked, bad


@pytest.fixture
def cluster(redis_cluster, key_prefix: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from robot_lab import connection

    monkeypatch.setenv("REDIS_URL", redis_cluster.url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    monkeypatch.setattr(connection, "_clients", {})
    client = connection.connect(redis_cluster.url)
    yield client
    client.close()


def _exercise_every_script(client: Any) -> None:
    """Run each script of robot-lab at least once."""
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.keys import default_keys
    from robot_lab.memory import Memory
    from robot_lab.network.dsl import create_network
    from robot_lab.network.run_state import RunStore
    from robot_lab.runtime.rails.budget.redis_ledger import RedisLedger, release_holder
    from robot_lab.schemas import RobotResult, TextMessage

    # bus: publish, replies (reply stream, outbox), conversations, DLQ, trim, heartbeat, hand back, reap
    bus = Bus(client)
    bus.register("audit")
    bus.register("asker")

    def handle(message: Any) -> str:
        if message.content == "bad":
            raise ValueError("no")
        return "ok"

    poller = BusPoller("audit", bus, consumer="a1", block_ms=0, retry_delay=0, max_deliveries=1,
                       visibility_timeout=0.2).respond_to_tasks(handle)
    asker = BusPoller("asker", bus, consumer="q1", block_ms=0).on_message(lambda message: None)
    for i in range(3):
        bus.publish("audit", f"c{i}", conversation_id="conv")
    bus.publish("audit", "bad", conversation_id="conv")
    bus.send_message("audit", "tell me", from_="asker")
    for _ in range(10):
        poller.poll(block_ms=0)
        asker.poll(block_ms=0)
    bus.publish("audit", "left behind")
    poller._read()
    poller._heartbeat()
    poller.hand_back()
    bus._trim(keys=[bus.keys.inbox("audit")], args=[1])
    bus._reap(keys=[bus.keys.inbox("audit")], args=["audit", "gone"])
    bus.deliver_reply(bus.build_reply(bus.publish("audit", "x", from_="nobody-yet"), "late"))

    # memory: write, compare-and-set, delete, clear
    memory = Memory(f"audit-{uid()}", redis=client)
    memory.set("a", 1)
    memory.update("a", lambda v: v + 1)
    memory.delete("a")
    memory.set("b", 2)
    memory.clear()
    memory.close()

    # budgets: every ledger script
    ledger = RedisLedger(f"audit-{uid()}", {"tokens": 100}, redis=client, ttl=60)
    ledger.reserve("tokens", 10)
    ledger.reserve_call("tokens", 5)
    ledger.reconcile("tokens", 10, 3)
    ledger.release("tokens", 5)
    registry = f"{default_keys().prefix}:audit-holds-{uid()}"
    client.sadd(registry, f"{ledger.key}\nholder-1")
    release_holder(client, registry)

    # network transitions
    net = create_network("audit")
    net.task("p1", "r1")
    net.task("p2", "r2")
    net.task("child", "r3", depends_on=["p1", "p2"])
    store = RunStore(client, default_keys(), f"audit-{uid()}")
    queued = store.create(net.validate(), message="m", context={}, app=None, max_concurrent=None)
    (t1, j1, _), (t2, j2, _) = queued
    assert store.claim(t1, j1, "w", lease_ms=50) == "ok"
    store.release(t1, j1, "retry me")
    assert store.start_task(t1, j1, "w", 50, ["status"]).status == "ok"  # claim + reads in one script
    store.complete(t1, j1, RobotResult(robot_name="r1", output=[TextMessage(content="x")]))
    assert store.claim(t2, j2, "w", lease_ms=1) == "ok"
    from robot_lab.errors import InputRequired

    asked = InputRequired("ok?")
    asked.request = {"id": f"audit-{uid()}", "question": "ok?"}
    assert waiting.park(store, t2, j2, asked)["status"] == "waiting"  # PARK, then RESUME
    assert store._eval(waiting.RESUME, t2, "{}")[0] in (b"ok", "ok")
    assert store.claim(t2, store.job_id(t2), "w", lease_ms=1) == "ok"  # the resumed attempt, its lease lapses
    time.sleep(0.05)
    assert [t for t, _, _ in store.reclaim()] == [t2]
    store.advance()
    store.emit("custom.event", task=t2)
    store.cancel("audit done")
    rerun = RunStore(client, default_keys(), f"audit-{uid()}")  # a failed task run again
    solo = create_network("audit-rerun")
    solo.task("only", "r1")
    [(task, job, _)] = rerun.create(solo.validate(), message="m", context={}, app=None, max_concurrent=None)
    assert rerun.claim(task, job, "w", lease_ms=5000) == "ok"
    rerun.complete(task, job, RobotResult.from_error("r1", RuntimeError("down")))
    assert rerun.status() == "completed_with_errors" and rerun.rerun(task)[0] == "ok"


def test_every_script_names_only_declared_keys_on_a_real_cluster(cluster, redis_cluster) -> None:  # type: ignore[no-untyped-def]
    monitors = [Monitor(port) for port in redis_cluster.primaries()]
    time.sleep(0.2)
    try:
        _exercise_every_script(cluster)
        time.sleep(0.5)
    finally:
        for m in monitors:
            m.stop()
    total, problems = 0, []
    shas = set()
    for m in monitors:
        checked, bad = _violations(m.port, m.lines)
        total += checked
        problems += bad
        shas |= {args[1] for source, args in m.lines if source != "lua" and args and args[0].upper() == b"EVALSHA"}
    assert problems == []
    assert total > 100  # the audit really saw the scripts' commands
    not_run = {n for n, s in _all_scripts().items() if hashlib.sha1(s.encode()).hexdigest().encode() not in shas}
    assert not_run == set()  # every script of robot-lab ran under the audit


def test_the_audit_catches_a_script_that_builds_a_sibling_key(cluster, redis_cluster) -> None:  # type: ignore[no-untyped-def]
    """The old bus scripts' pattern: legal for Redis 7 (same slot), caught by the audit."""
    key = f"audit:{{{uid()}}}"
    owner = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key)).port
    monitor = Monitor(owner)
    try:
        assert cluster.eval("return redis.call('EXISTS', KEYS[1] .. ':conv:c1')", 1, key) == 0
    finally:
        monitor.stop()
    _, bad = _violations(owner, monitor.lines)
    assert bad == [f"EXISTS {(key + ':conv:c1').encode()!r} not in KEYS {[key.encode()]}"]
