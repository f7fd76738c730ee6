"""Acceptance for ``robot-lab status --json`` with real processes on a real Redis: a worker
killed with -9 mid-task leaves an *abandoned* task and no live worker; a malformed envelope
published with XADD lands in the DLQ; ``robot-lab health`` follows; ``rq info`` still reads
our queues."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import redis

from robot_lab.runtime.registry import publish_specs
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.workers.fleet_status import collect_status, rq_registrations
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def client(real_redis_url, key_prefix, monkeypatch):
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    conn = redis.Redis.from_url(real_redis_url)
    yield conn
    from rq import Queue
    from rq.registry import StartedJobRegistry

    for robot in conn.smembers(f"{key_prefix}:robots"):  # rq keys are not prefixed: clean ours
        queue = Queue(f"robot:{robot.decode()}", connection=conn)
        for job_id in StartedJobRegistry(queue=queue).get_job_ids():
            conn.delete(f"rq:job:{job_id}")
        conn.delete(StartedJobRegistry(queue=queue).key)
        queue.delete(delete_jobs=True)
    keys = list(conn.scan_iter(match=f"{key_prefix}*", count=1000))
    if keys:
        conn.delete(*keys)
    conn.close()


def _row(data, robot):
    return next(r for r in data["robots"] if r["robot"] == robot)


def test_status_json_shows_killed_workers_abandoned_task_and_dlq(client, real_redis_url, key_prefix, processes,  # noqa: F811
                                                                 tmp_path):
    keys = Keys(prefix=key_prefix)
    slow = build(f"sleepy-{uid()}", model="scripted/sleep:5000")
    publish_specs([slow.to_spec()], connection=client, keys=keys)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_WORKER_HEARTBEAT="0.3",
                    ROBOT_LAB_HEALTH_DIR=str(tmp_path / "health"))
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", slow.name], env, "worker")
    wait_for(lambda: _row(collect_status(client, keys, [slow.name]), slow.name)["workers"] == 1, timeout=60,
             interval=0.2)
    probe = [str(VENV_BIN / "robot-lab"), "health", "--worker", f".{proc.pid}"]
    alive = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
    assert alive.returncode == 0, alive.stdout + alive.stderr
    assert "ok (worker, idle" in alive.stdout

    # a malformed envelope straight into the inbox: the worker's poller dead-letters it
    wait_for(lambda: client.exists(keys.inbox(slow.name)), timeout=30)
    client.xadd(keys.inbox(slow.name), {"envelope": b'{"v": 1, "content": 42'})
    wait_for(lambda: _row(collect_status(client, keys, [slow.name]), slow.name)["dlq"] == 1, timeout=30)

    net = create_network("abandon")
    net.task("nap", slow)
    handle = Coordinator(connection=client, keys=keys).submit(net, "zzz")
    wait_for(lambda: any(e.event == "task.started" for _, e in handle.store.events()), timeout=30)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    # rq still lists the killed worker (for up to the job timeout + 60 s): status calls it stale
    from rq import Queue, Worker

    queue = f"robot:{slow.name}"
    [stale] = rq_registrations(client, [queue], set(), clean=False)[queue]["stale"]
    assert stale.endswith(f".{proc.pid}") and len(Worker.all(queue=Queue(queue, connection=client))) == 1

    def abandoned() -> bool:
        row = _row(collect_status(client, keys, [slow.name]), slow.name)
        return row["abandoned"] == 1 and row["workers"] == 0

    wait_for(abandoned, timeout=30, interval=0.2)
    out = subprocess.run([str(VENV_BIN / "robot-lab"), "status", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    row = _row(data, slow.name)
    assert row["workers"] == 0 and row["abandoned"] == 1 and row["running"] == 0
    assert row["dlq"] == 1 and row["started"] == 1  # rq still lists the job as started
    [task] = data["abandoned"]
    assert task["run_id"] == handle.run_id and task["task"] == "nap" and task["robot"] == slow.name
    assert task["worker"] and task["worker"].endswith(f".{proc.pid}")
    assert task["reason"] == "worker lost (lease expired)"
    assert data["workers"] == []
    [run] = data["runs"]
    assert run["run_id"] == handle.run_id and run["finished"] == 0
    assert any("abandoned task" in p for p in data["problems"])
    # the stuck run: its task waits on a queue that no live worker serves
    assert f"{slow.name}: a run waits on it and no live worker serves robot:{slow.name} " \
           f"(start one: robot-lab worker {slow.name})" in data["problems"]
    assert row["rq_workers"] == 0 and Worker.all(queue=Queue(queue, connection=client)) == []  # cleaned up
    assert not client.exists(f"rq:worker:{stale}")
    table = subprocess.run([str(VENV_BIN / "robot-lab"), "status", slow.name], env=env, capture_output=True,
                           text=True, timeout=60)
    assert table.returncode == 0 and f"! {slow.name}: a run waits on it and no live worker" in table.stdout
    dead = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
    assert dead.returncode == 1 and "is gone" in dead.stdout


def test_rq_info_lists_robot_queues(client, key_prefix):
    robot = build(f"rqinfo-{uid()}", model="scripted/echo")
    net = create_network("rqinfo")
    net.task("only", robot)
    Coordinator(connection=client, keys=Keys(prefix=key_prefix)).submit(net, "hello")
    url = os.environ["REDIS_URL"]
    try:
        out = subprocess.run([str(VENV_BIN / "rq"), "info", "--url", url, f"robot:{robot.name}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"robot:{robot.name}" in out.stdout and "1 queues, 1 jobs total" in out.stdout
    finally:
        from rq import Queue

        Queue(f"robot:{robot.name}", connection=client).delete(delete_jobs=True)
