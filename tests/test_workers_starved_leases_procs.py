"""A worker starved of CPU keeps its tasks: a 1000-task fan-out taken by one
``robot-lab worker --in-flight 1000`` process as it starts, with two CPU hogs beside it,
runs without a sweeper requeuing a task whose worker is alive (``run.requeued``) and without
a lease lost under a live task (``task.lease_lost``).

Before, at a load of 10-21 a start of such a worker requeued tens to hundreds of live tasks:
the claim refused the second runs, but each was a sweep's work and a log line an operator
reads as a crashed worker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from tests.network_helpers import fan
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, publish_robot, uid  # noqa: F401

pytestmark = pytest.mark.slow

TASKS = 1000


def _events(proc: Any) -> list[dict[str, Any]]:
    text = Path(proc.log_path).read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_cpu_starved_worker_keeps_a_1000_task_fan_out(real_redis_url: str, key_prefix: str,
                                                        processes) -> None:  # noqa: F811
    client = redis.Redis.from_url(real_redis_url)
    keys = Keys(prefix=key_prefix)
    bot = publish_robot(client, key_prefix, f"starved-{uid()}", model="scripted/sleep:2000")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        # submitted first: the worker takes the whole fan-out while it starts (imports, warm-up)
        handle = Coordinator(connection=client, keys=keys).submit(fan(bot, TASKS, f"starved-{uid()}"), "go")
        env = child_env(real_redis_url, key_prefix, ROBOT_LAB_LOG_LEVEL="INFO")
        env.pop("ROBOT_LAB_TASK_LEASE_MS")  # the deployed default, not the tests' short lease
        worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--in-flight", str(TASKS)],
                                 env, "worker")
        started = time.monotonic()
        # the run's status, read without sweeping: only the worker's sweeper sweeps
        wait_for(lambda: handle.status in ("completed", "failed", "cancelled"), timeout=240, interval=0.5)
        print(f"\n{TASKS} tasks in {time.monotonic() - started:.1f} s from the worker's start")
    except Exception:
        print(processes.logs())
        raise
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert handle.status == "completed", processes.logs()
    trouble = [e for e in _events(worker) if e.get("event") in ("run.requeued", "task.lease_lost",
                                                                 "worker.job_hold_lost")]
    assert not trouble, trouble[:5]
    client.close()
