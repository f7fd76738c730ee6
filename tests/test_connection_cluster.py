"""robot-lab on a real Redis Cluster (3 primaries, 3 replicas, started by the ``redis_cluster``
fixture) through a ``redis+cluster://`` URL: the bus, Memory, budgets and loop guards in this
process; network runs, a bus request, status and kill -9 recovery with real
``robot-lab worker`` processes (which get ``RQ_KEY_PREFIX={rq}``, the documented setting)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robot_lab.errors import BudgetExceeded
from robot_lab.keys import Keys
from tests.redis_server import REPO_ROOT, wait_for
from tests.worker_procs import VENV_BIN, Processes, child_env, uid

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def cluster(redis_cluster, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A ``RedisCluster`` client; this process's settings point at the cluster (hash-tagged keys)."""
    from robot_lab import connection

    monkeypatch.setenv("REDIS_URL", redis_cluster.url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    monkeypatch.setattr(connection, "_clients", {})
    client = connection.connect(redis_cluster.url)
    yield client
    client.close()


def test_keys_of_one_robot_share_a_slot_and_robots_spread_over_primaries(cluster, key_prefix) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.keys import default_keys

    keys = default_keys()
    assert keys.cluster
    one = [keys.inbox("billing"), keys.dlq("billing"), keys.conversation_queue("billing"),
           keys.conversation_heads("billing"), keys.outbox_entry("billing", "m1")]
    assert len({cluster.keyslot(k) for k in one}) == 1
    owners = {cluster.nodes_manager.get_node_from_slot(cluster.keyslot(keys.inbox(f"robot{i}"))).name
              for i in range(20)}
    assert len(owners) == 3  # twenty robots' inboxes land on all three primaries


def test_bus_request_reply_conversations_and_dead_letters(cluster) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.bus import Bus, BusPoller

    bus = Bus(cluster)
    bus.register("svc")
    order: list[str] = []

    def handle(message: Any) -> str:
        if message.content == "bad":
            raise ValueError("refused on purpose")
        if message.conversation_id:
            order.append(message.content)
        return f"re: {message.content}"

    poller = BusPoller("svc", bus, consumer="c1", block_ms=50, retry_delay=0, max_deliveries=2,
                       visibility_timeout=2).respond_to_tasks(handle)
    poller.start()
    try:
        reply = bus.request("svc", "hello", timeout=20)
        assert reply.content == "re: hello" and reply.kind == "reply"
        for i in range(5):
            bus.publish("svc", f"turn {i}", conversation_id="conv-1")
        bus.publish("svc", "bad")
        wait_for(lambda: len(order) == 5 and bus.dlq_size("svc") == 1)
        assert order == [f"turn {i}" for i in range(5)]
        [letter] = bus.dead_letters("svc")
        assert "refused on purpose" in letter.error
        assert len(bus.replay_dead_letters("svc")) == 1  # XADD + XDEL in one MULTI, one slot
        wait_for(lambda: bus.dlq_size("svc") == 1)
    finally:
        poller.stop()
    assert not cluster.exists(bus.keys.conversation_queue("svc"))


def test_memory_wait_subscribe_and_compare_and_set(cluster) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.memory import Memory

    memory = Memory(f"scope-{uid()}", redis=cluster)
    seen: list[Any] = []
    memory.subscribe("counter", callback=lambda change: seen.append(change.value))
    threading.Timer(0.3, lambda: memory.set("ready", "yes")).start()
    assert memory.get("ready", wait=10) == "yes"

    def bump() -> None:
        other = Memory(memory.scope, redis=cluster)
        for _ in range(15):
            other.update("counter", lambda v: (v or 0) + 1)

    threads = [threading.Thread(target=bump) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert memory.get("counter") == 30  # no lost update under concurrent compare-and-set
    wait_for(lambda: len(seen) == 30)
    assert sorted(seen) == list(range(1, 31))
    assert [c.version for c in memory.changes()] == list(range(1, memory.version + 1))
    memory.close()


def test_budget_ledger_and_loop_guard(cluster) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.runtime.rails.budget.redis_ledger import RedisLedger
    from robot_lab.runtime.rails.doom_loop import RedisDoomLoopDetector

    ledger = RedisLedger(f"tenant-{uid()}", {"tokens": 100}, redis=cluster)
    ledger.reserve("tokens", 60)
    with pytest.raises(BudgetExceeded):
        RedisLedger(ledger.scope, None, redis=cluster).reserve("tokens", 50)  # another process's view
    ledger.reconcile("tokens", 60, 30)
    assert ledger.consumed == {"tokens": 30} and ledger.reserved == {"tokens": 0}

    guard = RedisDoomLoopDetector(f"run-{uid()}", redis=cluster)
    assert [guard.observe("add") for _ in range(2)] == [None, None]
    assert "called 3+ times" in (guard.observe("add") or "")


# --- real worker processes -----------------------------------------------------------------

class ClusterFleet:
    """Two ``robot-lab worker`` processes serving the scenario robots of ``tag``."""

    def __init__(self, url: str, prefix: str, tag: str, procs: Processes) -> None:
        self.url, self.prefix, self.tag, self.procs = url, prefix, tag, procs
        self.env = child_env(url, prefix, RQ_KEY_PREFIX="{rq}", ROBOT_LAB_TASK_LEASE_MS="1500")

    def scenario(self, name: str, timeout: float = 120) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "tests/cluster_scenarios.py", name, self.tag], env=self.env,
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:] + self.procs.logs()
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fleet(redis_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFleet]:  # type: ignore[no-untyped-def]
    from robot_lab.connection import connect
    from robot_lab.workers.fleet_status import live_workers

    procs = Processes(Path(tmp_path_factory.mktemp("cluster-fleet")))
    fleet = ClusterFleet(redis_cluster.url, f"rlcl-{uid()}", uid(), procs)
    robots = fleet.scenario("publish")["published"]
    try:
        for i in range(2):
            procs.start([str(VENV_BIN / "robot-lab"), "worker", *robots], fleet.env, f"worker{i}")
        client = connect(redis_cluster.url)
        keys = Keys(prefix=fleet.prefix, cluster=True)
        wait_for(lambda: len([w for w in live_workers(client, keys) if w.get("role") == "worker"]) == 2,
                 timeout=90, interval=0.2)
        yield fleet
    finally:
        procs.kill_all()


def test_networks_fan_out_route_budget_and_loop_guard_on_worker_processes(fleet: ClusterFleet) -> None:
    out = fleet.scenario("networks")
    fan = out["fan"]
    assert fan["status"] == "completed" and set(fan["states"].values()) == {"done"}
    assert "left side" in fan["reply"] and "right side" in fan["reply"]  # fan-in saw both branches
    route = out["route"]
    assert route["activated"] == ["tech"] and route["states"]["billing"] == "skipped"
    assert route["states"]["tech"] == "done"
    budget = out["budget"]
    assert budget["states"]["a"] == "done"
    assert any("budget" in e.lower() for e in budget["errors"].values()), budget["errors"]
    loop = out["loop"]
    assert loop["states"] == {"a": "failed", "b": "failed"}  # max_tool_rounds stopped both
    assert "called 3+ times" in loop["outputs"][2] and "called 3+ times" not in loop["outputs"][1]


def test_bus_request_served_by_a_worker_process(fleet: ClusterFleet, redis_cluster, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.bus import Bus
    from robot_lab.connection import connect

    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", fleet.prefix)
    bus = Bus(connect(redis_cluster.url), keys=Keys(prefix=fleet.prefix, cluster=True))
    reply = bus.request(f"join-{fleet.tag}", "over the cluster", timeout=30)
    assert reply.content == "echo: over the cluster"


def test_status_reads_the_cluster(fleet: ClusterFleet) -> None:
    done = subprocess.run([str(VENV_BIN / "robot-lab"), "status", "--json"], env=fleet.env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    data = json.loads(done.stdout)
    rows = {r["robot"]: r for r in data["robots"]}
    row = rows[f"join-{fleet.tag}"]
    assert row["workers"] == 2 and row["rq_workers"] == 2 and row["stale_rq_workers"] == []
    assert row["queue_key"] == f"{{rq}}:queue:robot:join-{fleet.tag}"


def test_kill_9_worker_mid_task_is_rerun_by_the_other(fleet: ClusterFleet, redis_cluster) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.connection import connect
    from robot_lab.network.run_state import RunStore

    proc = subprocess.Popen([sys.executable, "tests/cluster_scenarios.py", "slow", fleet.tag], env=fleet.env,
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = json.loads(proc.stdout.readline())["run_id"]  # type: ignore[union-attr]
        store = RunStore(connect(redis_cluster.url), Keys(prefix=fleet.prefix, cluster=True), run_id)
        started = wait_for(lambda: [e for _, e in store.events() if e.event == "task.started"], timeout=30)
        pid = int(re.match(r"robot-lab\..+\.(\d+)(\.\d+)?:\d+$", started[0].data["worker"]).group(1))  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "completed", err[-2000:]
    assert result["reply"] == "echo: slow" or result["states"] == {"slow": "done", "after": "done"}
    assert store.attempts()["slow"] == 2
    assert [e.data["reason"] for _, e in store.events() if e.event == "task.retrying"] == \
        ["worker lost (lease expired)"]


def test_rq_needs_a_hash_tagged_prefix_on_a_cluster(cluster) -> None:  # type: ignore[no-untyped-def]
    """This process imported rq with the default ``RQ_KEY_PREFIX`` (``rq``): on a cluster
    that is refused with the fix named, instead of CROSSSLOT errors deep inside rq."""
    import fakeredis

    from robot_lab.errors import ConfigurationError
    from robot_lab.rq_connection import data_connection, rq_connection

    with pytest.raises(ConfigurationError, match=r"RQ_KEY_PREFIX='\{rq\}'"):
        rq_connection(cluster)
    plain = fakeredis.FakeRedis()
    assert rq_connection(plain) is plain and data_connection(plain) is plain
