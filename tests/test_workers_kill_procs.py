"""Durability with real processes on a real Redis: kill -9 the coordinator, kill -9 a worker
mid-task, SIGTERM a worker mid-task."""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.network.run_state import RunStore
from tests.redis_server import wait_for
from tests.stopping import stopped
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

COORDINATOR_SCRIPT = r"""
import sys
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
a, b, c = sys.argv[1:4]
net = create_network("durable")
net.task("first", build(a, model="scripted/sleep:600"))
net.task("second", build(b, model="scripted/sleep:600"), depends_on="first")
net.task("third", build(c, model="scripted/echo"), depends_on="second")
handle = net.submit("keep going")
print(handle.run_id, flush=True)
handle.wait(timeout=120)
print("coordinator saw the end", flush=True)
"""


@pytest.fixture
def client(real_client):
    return real_client


def _events(store, name, task=None):
    return [e for _, e in store.events() if e.event == name and (task is None or e.task == task)]


def _pid_of(worker: str) -> int:
    match = re.match(r"robot-lab\..+\.(\d+)(\.\d+)?:\d+$", worker)
    assert match, worker
    return int(match.group(1))


def test_kill_9_coordinator_mid_run_workers_finish_it(client, real_redis_url, key_prefix, processes, tmp_path):  # noqa: F811
    names = [f"step{i}-{uid()}" for i in range(3)]
    publish_specs([build(n, model="scripted/echo").to_spec() for n in names], connection=client)
    env = child_env(real_redis_url, key_prefix)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", *names, "--no-bus"], env, "worker")
    wait_for_workers(client, [f"robot:{n}" for n in names], timeout=60)
    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR_SCRIPT)
    coordinator = processes.start([sys.executable, str(script), *names], env, "coordinator")
    log = coordinator.log_path  # type: ignore[attr-defined]
    run_id = wait_for(lambda: log.read_text().split()[0] if log.read_text().strip() else None, timeout=60)
    store = RunStore(client, Keys(prefix=key_prefix), run_id)
    wait_for(lambda: _events(store, "task.completed", "first"), timeout=30)
    os.kill(coordinator.pid, signal.SIGKILL)
    coordinator.wait(5)
    assert store.status() == "running"
    # nobody sweeps or waits here: the workers advance the DAG on their own
    wait_for(lambda: store.status() == "completed", timeout=60, interval=0.1)
    result = Coordinator(connection=client).attach(run_id).wait(timeout=10)
    assert result.states == {"first": "done", "second": "done", "third": "done"}
    assert result.reply == "echo: echo: echo: keep going"
    assert "coordinator saw the end" not in log.read_text()


def test_kill_9_worker_mid_task_is_rerun_elsewhere(client, real_redis_url, key_prefix, processes):  # noqa: F811
    slow = build(f"slow-{uid()}", model="scripted/sleep:3000")
    fast = build(f"fast-{uid()}", model="scripted/echo")
    publish_specs([slow.to_spec(), fast.to_spec()], connection=client)
    env = child_env(real_redis_url, key_prefix)
    for i in range(2):
        processes.start([str(VENV_BIN / "robot-lab"), "worker", slow.name, fast.name, "--no-bus"], env, f"w{i}")
    wait_for_workers(client, [f"robot:{slow.name}"], timeout=60)
    wait_for(lambda: len(__import__("rq").Worker.all(queue=__import__("rq").Queue(f"robot:{slow.name}",
                                                                                   connection=client))) == 2,
             timeout=60, interval=0.2)
    net = create_network("victim")
    net.task("slow", slow)
    net.task("after", fast, depends_on="slow")
    handle = Coordinator(connection=client).submit(net, "survive")
    store = handle.store
    first = wait_for(lambda: _events(store, "task.started", "slow"), timeout=30)[0]
    os.kill(_pid_of(first.data["worker"]), signal.SIGKILL)
    # no coordinator sweeps: the surviving worker's sweeper notices the expired lease
    wait_for(lambda: store.status() == "completed", timeout=60, interval=0.1)
    starts = _events(store, "task.started", "slow")
    assert len(starts) == 2 and starts[0].data["worker"] != starts[1].data["worker"]
    assert store.attempts()["slow"] == 2
    assert len(_events(store, "task.completed", "slow")) == 1
    assert [e.data["reason"] for e in _events(store, "task.retrying", "slow")] == ["worker lost (lease expired)"]
    assert handle.result().reply == "echo: echo: survive"


def test_sigterm_lets_the_task_in_hand_finish(client, real_redis_url, key_prefix, processes):  # noqa: F811
    slow = build(f"term-{uid()}", model="scripted/sleep:1500")
    publish_specs([slow.to_spec()], connection=client)
    env = child_env(real_redis_url, key_prefix)
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", slow.name], env, "worker")
    wait_for_workers(client, [f"robot:{slow.name}"], timeout=60)
    net = create_network("graceful")
    net.task("only", slow)
    handle = Coordinator(connection=client).submit(net, "finish me")
    wait_for(lambda: _events(handle.store, "task.started", "only"), timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert stopped(proc) == 0
    assert handle.store.status() == "completed"
    assert handle.store.attempts()["only"] == 1
    assert handle.result().reply == "echo: finish me"


def test_concurrency_runs_tasks_in_parallel_and_stops_on_sigterm(client, real_redis_url, key_prefix,
                                                                  processes):  # noqa: F811
    bot = build(f"pair-{uid()}", model="scripted/sleep:800")
    publish_specs([bot.to_spec()], connection=client)
    env = child_env(real_redis_url, key_prefix)
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--concurrency", "2"], env, "worker")
    from rq import Queue, Worker

    wait_for(lambda: len(Worker.all(queue=Queue(f"robot:{bot.name}", connection=client))) == 2, timeout=60,
             interval=0.2)
    net = create_network("pair")
    with net.parallel("both"):
        net.task("left", bot)
        net.task("right", bot)
    handle = Coordinator(connection=client).submit(net, "x")
    result = handle.wait(timeout=60)
    assert result.states == {"left": "done", "right": "done"}
    started = {e.task: e for e in _events(handle.store, "task.started")}
    finished = {e.task: e.ts for e in _events(handle.store, "task.completed")}
    assert started["left"].data["worker"] != started["right"].data["worker"]
    assert max(e.ts for e in started.values()) < min(finished.values())
    proc.send_signal(signal.SIGTERM)
    assert stopped(proc) == 0
