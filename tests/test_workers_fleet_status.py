"""``robot-lab status`` / ``runs`` / ``health`` on both backends, and the worker heartbeat.

The acceptance case with real processes (kill -9 a worker mid-task, a malformed envelope in
the DLQ) is in tests/test_workers_fleet_status_procs.py.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from click.testing import CliRunner

from robot_lab.bus import Bus, BusPoller
from robot_lab.cli import main
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.workers import health
from robot_lab.workers.health import WorkerHeartbeat, check_health, rq_loop_problem
from robot_lab.workers.fleet_status import collect_status, recent_runs
from tests.redis_server import wait_for
from tests.worker_procs import uid


@pytest.fixture(autouse=True)
def _health_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ROBOT_LAB_HEALTH_DIR", str(tmp_path / "health"))


def _row(data, robot):
    [row] = [r for r in data["robots"] if r["robot"] == robot]
    return row


def test_status_reports_queue_abandoned_task_dead_letters_and_workers(redis_client, key_prefix):
    keys = Keys(prefix=key_prefix)
    slow, idle = f"slow-{uid()}", f"idle-{uid()}"
    net = create_network(f"st-{uid()}")
    with net.parallel("both"):
        net.task("a", build(slow, model="scripted/echo"))
        net.task("b", build(idle, model="scripted/echo"))
    handle = Coordinator(connection=redis_client, keys=keys).submit(net, "hi")
    data = collect_status(redis_client, keys)
    assert _row(data, slow)["queued"] == 1 and _row(data, idle)["queued"] == 1
    assert _row(data, slow)["workers"] == 0
    [run] = data["runs"]
    assert run["run_id"] == handle.run_id and run["tasks"] == 2 and run["finished"] == 0
    assert any(p.startswith(f"{slow}: 1 queued job(s) and no live worker on robot:{slow}") for p in data["problems"])

    # a worker claims task a and dies: its lease expires, nobody sweeps
    job_id = handle.store.job_id("a")
    assert handle.store.claim("a", job_id, "robot-lab.ghost.1", lease_ms=50) == "ok"
    wait_for(lambda: not redis_client.exists(keys.run_lease(handle.run_id, "a")))
    data = collect_status(redis_client, keys)
    assert _row(data, slow)["abandoned"] == 1 and _row(data, idle)["abandoned"] == 0
    [lost] = data["abandoned"]
    assert (lost["task"], lost["robot"], lost["job_id"], lost["reason"]) == ("a", slow, job_id,
                                                                             "worker lost (lease expired)")

    # a malformed envelope, dead-lettered by a poller
    bus = Bus(redis=redis_client, keys=keys)
    bus.register(idle)
    redis_client.xadd(keys.inbox(idle), {"envelope": b"{not json"})
    BusPoller(idle, bus, redis=redis_client).run_once()
    data = collect_status(redis_client, keys)
    assert _row(data, idle)["dlq"] == 1 and _row(data, idle)["bus_lag"] == 0
    assert any(p.startswith(f"{idle}: 1 dead letter") for p in data["problems"])

    # a heartbeat makes a worker alive; its key expiring makes it dead again
    beat = WorkerHeartbeat(redis_client, keys, f"robot-lab.test.{os.getpid()}", [slow], role="worker",
                           interval=0.1)
    assert beat.beat()
    assert _row(collect_status(redis_client, keys), slow)["workers"] == 1
    wait_for(lambda: _row(collect_status(redis_client, keys), slow)["workers"] == 0)
    assert collect_status(redis_client, keys)["workers"] == []
    assert redis_client.zcard(keys.workers()) == 0  # pruned


def test_status_cli_json_and_table(redis_client, key_prefix):
    robot = f"cli-{uid()}"
    bus = Bus(redis=redis_client, keys=Keys(prefix=key_prefix))
    bus.register(robot)
    bus.publish(robot, "waiting")
    result = CliRunner().invoke(main, ["status", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["prefix"] == key_prefix
    row = _row(data, robot)
    assert row["bus_length"] == 1 and row["bus_lag"] == 1 and row["queue"] == f"robot:{robot}"
    # registered by hand, never published or served: an orphan, not (also) an unserved inbox
    assert [p for p in data["problems"] if robot in p] == [
        f"orphan inbox {robot!r}: registered, but no robot of that name is published or served (1 message(s) in "
        f"it; a mistyped `send --create`? remove it with `robot-lab bus remove {robot}`)"]
    redis_client.set(Keys(prefix=key_prefix).robot_spec(robot), b"{}")  # published: its inbox waits on a worker
    data = json.loads(CliRunner().invoke(main, ["status", "--json"]).output)
    assert [p for p in data["problems"] if robot in p] == [
        f"{robot}: 1 unread message(s) in its inbox and no live robot-lab worker serving it "
        f"(start one: robot-lab worker {robot})"]
    table = CliRunner().invoke(main, ["status", robot], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and robot in table.output and "no active runs" in table.output


def test_status_bus_pending_column_counts_entries_delivered_and_not_acked(redis_client, key_prefix):
    """The table's "bus pending" column (JSON ``bus_pending``) is the inbox's XPENDING, apart
    from "bus lag" (entries not delivered yet)."""
    robot = f"pend-{uid()}"
    keys = Keys(prefix=key_prefix)
    bus = Bus(redis=redis_client, keys=keys)
    bus.register(robot)
    bus.publish(robot, "one")
    bus.publish(robot, "two")
    redis_client.xreadgroup(robot, "reader", {keys.inbox(robot): ">"}, count=1)  # delivered, never acked
    row = _row(json.loads(CliRunner().invoke(main, ["status", "--json"]).stdout), robot)
    assert (row["bus_pending"], row["bus_lag"]) == (1, 1)
    lines = CliRunner().invoke(main, ["status", robot], env={"COLUMNS": "200"}).output.splitlines()
    columns = re.split(r"\s{2,}", next(line for line in lines if line.startswith("robot ")).strip())
    [cells] = [line.split() for line in lines if line.startswith(robot)]
    shown = dict(zip(columns, cells, strict=True))
    assert (shown["bus lag"], shown["bus pending"]) == ("1", "1")


def test_runs_lists_tokens_cost_and_duration(redis_client, key_prefix, monkeypatch):
    if os.environ.get("REDIS_URL"):
        pytest.skip("embedded workers run on the fakeredis half")
    net = create_network("tally")
    net.task("one", build(f"r1-{uid()}", model="scripted/echo"))
    net.task("two", build(f"r2-{uid()}", model="scripted/echo"), depends_on="one")
    result = net.run("count my tokens", connection=redis_client)
    assert result.status == "completed"
    [row] = recent_runs(redis_client, Keys(prefix=key_prefix))
    tokens = sum(r.input_tokens + r.output_tokens for r in result.context.values())
    assert row["run_id"] == result.run_id and row["status"] == "completed" and row["network"] == "tally"
    assert row["tasks"] == 2 and row["done"] == 2 and row["tokens"] == tokens > 0
    assert row["duration"] is not None and row["duration"] > 0
    out = CliRunner().invoke(main, ["runs", "--json"])  # stdout: an embedded worker may still be logging
    assert out.exit_code == 0 and json.loads(out.stdout)[0]["run_id"] == result.run_id
    assert CliRunner().invoke(main, ["runs", "--status", "running", "--json"]).output.strip() == "[]"
    table = CliRunner().invoke(main, ["runs"], env={"COLUMNS": "200"})
    assert result.run_id in table.output and "completed" in table.output


def test_check_health_fresh_stale_and_dead(tmp_path, redis_client, key_prefix):
    directory = tmp_path / "hb"
    beat = WorkerHeartbeat(redis_client, Keys(prefix=key_prefix), "robot-lab.me.1", ["x"], role="worker",
                           interval=1, directory=directory)
    ok, lines = check_health(directory)
    assert not ok and "no worker heartbeat" in lines[0]
    assert beat.beat()
    ok, lines = check_health(directory)
    assert ok and lines[0].startswith("robot-lab.me.1: ok")
    old = time.time() - 100
    os.utime(beat.file, (old, old))
    ok, lines = check_health(directory)
    assert not ok and "no healthy beat for 100s (limit 30s)" in lines[0]
    assert check_health(directory, worker="nobody")[0] is False
    # a file of a process of this host that is gone
    data = json.loads(beat.file.read_text())
    data.update(pid=2**22 + 12345, name="robot-lab.me.dead")
    (directory / "robot-lab.me.dead.json").write_text(json.dumps(data))
    ok, lines = check_health(directory, worker="dead")
    assert not ok and "is gone" in lines[0]
    health.prune_dead_files(directory)
    assert not (directory / "robot-lab.me.dead.json").exists()
    beat.stop()
    assert not beat.file.exists() and not redis_client.exists(Keys(prefix=key_prefix).worker("robot-lab.me.1"))


def test_failing_check_stops_the_beat(tmp_path, redis_client, key_prefix):
    problem = {"text": None}
    beat = WorkerHeartbeat(redis_client, Keys(prefix=key_prefix), "w1", ["x"], role="rq",
                           checks=[lambda: problem["text"]], interval=1, directory=tmp_path)
    assert beat.beat()
    problem["text"] = "rq loop silent"
    assert not beat.beat() and beat.problem == "rq loop silent"


class _FakeWorker:
    dequeue_timeout = 30
    loop_beat = 0.0
    busy = None


def test_rq_loop_problem_tells_busy_from_wedged():
    worker = _FakeWorker()
    assert rq_loop_problem(worker) is None  # starting
    worker.loop_beat = time.monotonic()
    assert rq_loop_problem(worker) is None
    worker.loop_beat = time.monotonic() - 100
    assert "rq loop silent for 100s" in rq_loop_problem(worker)
    worker.busy = ("job-1", time.monotonic() - 100, 600)
    assert rq_loop_problem(worker) is None  # a long job within its timeout
    worker.busy = ("job-1", time.monotonic() - 700, 600)
    assert "job job-1 running 700s, past its 600s timeout" in rq_loop_problem(worker)


def test_health_cli_exit_codes(tmp_path, monkeypatch, redis_client, key_prefix):
    directory = tmp_path / "cli-health"
    monkeypatch.setenv("ROBOT_LAB_HEALTH_DIR", str(directory))
    from robot_lab import settings

    settings.reload_settings()
    result = CliRunner().invoke(main, ["health"])
    assert result.exit_code == 1 and "no worker heartbeat" in result.output
    beat = WorkerHeartbeat(redis_client, Keys(prefix=key_prefix), "robot-lab.probe.7", ["x"], role="worker",
                           interval=5)
    assert beat.beat()
    result = CliRunner().invoke(main, ["health", "--worker", "probe"])
    assert result.exit_code == 0 and "robot-lab.probe.7: ok" in result.output
    result = CliRunner().invoke(main, ["health", "--ready"])
    assert result.exit_code == 0, result.output
    redis_client.delete(Keys(prefix=key_prefix).worker("robot-lab.probe.7"))
    result = CliRunner().invoke(main, ["health", "--ready"])
    assert result.exit_code == 1 and "no heartbeat in Redis" in result.output
