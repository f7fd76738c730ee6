"""What rq's own tools and robot-lab's readers show of workers with real processes: a robot
served only by a plain `rq worker robot:<name>` is listed while idle (status, metrics), and
an idle `robot-lab worker --in-flight N` reads `idle` in rq's registry, not `busy`."""

from __future__ import annotations

import subprocess

import pytest
from rq import Queue, Worker

from robot_lab.runtime.registry import publish_specs
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.workers.fleet_status import collect_status
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow


def test_an_idle_robot_served_only_by_a_plain_rq_worker_is_listed(real_client, real_redis_url, key_prefix,
                                                                   processes):  # noqa: F811
    keys = Keys(prefix=key_prefix)
    bot = build(f"plainrq-{uid()}", model="scripted/echo")
    publish_specs([bot.to_spec()], connection=real_client, keys=keys)  # no inbox, no run, no robot-lab worker
    processes.start([str(VENV_BIN / "rq"), "worker", f"robot:{bot.name}", "--url", real_redis_url],
                    child_env(real_redis_url, key_prefix), "rq")
    wait_for_workers(real_client, [f"robot:{bot.name}"])

    data = collect_status(real_client, keys)
    [row] = [r for r in data["robots"] if r["robot"] == bot.name]
    assert row["rq_workers"] == 1 and row["queued"] == 0 and row["workers"] == 0
    assert row["rq_worker_names"] == [w.name for w in Worker.all(queue=Queue(f"robot:{bot.name}",
                                                                              connection=real_client))]
    assert not [p for p in data["problems"] if bot.name in p]  # served: nothing to fix

    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from robot_lab.workers.fleet_gauges import RedisCollector

    registry = CollectorRegistry()
    registry.register(RedisCollector(real_client, keys))
    text = generate_latest(registry).decode()
    assert f'robot_lab_queue_depth{{queue="tasks",robot="{bot.name}"}} 0.0' in text  # a KEDA/alert series

    # a robot of another prefix's rq queue is not this prefix's
    other = collect_status(real_client, Keys(prefix=key_prefix + "-other"))
    assert bot.name not in [r["robot"] for r in other["robots"]]


def test_an_idle_in_flight_worker_reads_idle_in_rq(real_client, real_redis_url, key_prefix, processes):  # noqa: F811
    keys = Keys(prefix=key_prefix)
    bot = build(f"idle-{uid()}", model="scripted/sleep:200")
    publish_specs([bot.to_spec()], connection=real_client, keys=keys)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--in-flight", "4"],
                    child_env(real_redis_url, key_prefix), "worker")
    queue = f"robot:{bot.name}"
    wait_for_workers(real_client, [queue])
    network = create_network(f"idle-{uid()}")
    with network.parallel("three"):
        for i in range(3):
            network.task(f"t{i}", bot)
    result = Coordinator(connection=real_client, keys=keys).submit(network, "x").wait(timeout=60)
    assert result.status == "completed", processes.logs()

    def state() -> str:
        [worker] = Worker.all(queue=Queue(queue, connection=real_client))
        return worker.get_state()

    wait_for(lambda: state() == "idle", interval=0.1)  # it stayed `busy` forever
    info = subprocess.run([str(VENV_BIN / "rq"), "info", "--url", real_redis_url, "--only-workers", queue],
                          capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and f"): idle {queue}" in info.stdout and "): busy" not in info.stdout, info.stdout
