"""One SIGTERM stops a ``robot-lab worker`` promptly whatever its Redis and MCP servers are
doing: an idle worker while its Redis server is down, an idle worker whose robots used an MCP
server, and a worker with one job in hand once that job is done (the documented drain).

Each test waits for the process to exit (a generous bound) and reads the worker's
``worker.stopping`` line: the path the stop took (``idle``: nothing in hand, nothing to wait
for; ``drain``: the jobs in hand first). The seconds from SIGTERM to exit are printed
(``pytest -s``) for the operator's numbers, not asserted: this machine may be loaded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from tests.redis_server import RedisServer, wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, publish_robot, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

CALCULATOR = str(Path(__file__).parent / "mcp_servers" / "calculator.py")
EXIT_BOUND = 60.0  # generous: the design waits on no timeout, the machine may be loaded


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test alone: the test stops it under a running worker."""
    server = RedisServer()
    if not server.start(private=True):
        pytest.skip(f"no private redis-server: {server.reason}")
    try:
        yield server
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)  # a test may have hung it
        server.stop()


def _events(proc: Any) -> list[dict[str, Any]]:
    text = Path(proc.log_path).read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _stop(proc: subprocess.Popen[bytes], what: str) -> float:
    """SIGTERM ``proc``, wait for it to exit; the seconds it took (printed)."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(EXIT_BOUND)
    took = time.monotonic() - started
    print(f"\n{what}: exited {proc.returncode} {took:.2f} s after SIGTERM")
    return took


def _stopping(proc: Any) -> dict[str, Any]:
    [line] = [e for e in _events(proc) if e.get("event") == "worker.stopping"]
    return line


def _worker(processes: Any, url: str, prefix: str, robot: str, *extra: str) -> subprocess.Popen[bytes]:  # noqa: F811
    env = child_env(url, prefix, ROBOT_LAB_LOG_LEVEL="INFO")
    return processes.start([str(VENV_BIN / "robot-lab"), "worker", robot, *extra], env, "worker")


@pytest.mark.parametrize("in_flight", ["1", "4"])
@pytest.mark.parametrize("outage", ["down", "hung"])
def test_sigterm_stops_an_idle_worker_while_its_redis_is_away(private_redis: RedisServer, key_prefix: str,
                                                              in_flight: str, outage: str,
                                                              processes) -> None:  # noqa: F811
    """``down``: the server stopped (connections refused); ``hung``: the server process
    stopped with SIGSTOP (connections open, nothing answers: a partition or a wedged host).
    Before, under a hung Redis the SIGTERM handler itself blocked writing rq's shutdown date
    and the worker never stopped."""
    url = private_redis.url
    assert url
    client = redis.Redis.from_url(url)
    bot = publish_robot(client, key_prefix, f"stop-{uid()}", model="scripted/echo")
    worker = _worker(processes, url, key_prefix, bot.name, "--in-flight", in_flight)
    try:
        wait_for_workers(client, [f"robot:{bot.name}"], timeout=90)
        # idle in rq's blocking dequeue: past start-up, rq's signal handlers installed
        wait_for(lambda: any(c.get("cmd") == "blmove" for c in client.client_list()), timeout=90)
        if outage == "down":
            private_redis.stop()
            wait_for(lambda: any(e.get("event") == "redis.lost" for e in _events(worker)), timeout=60)
        else:
            assert private_redis.process is not None
            private_redis.process.send_signal(signal.SIGSTOP)
        _stop(worker, f"idle worker, Redis {outage}, --in-flight {in_flight}")
    except Exception:
        print(processes.logs())
        raise
    assert worker.returncode == 0, processes.logs()
    assert _stopping(worker)["path"] == "idle", processes.logs()


def test_sigterm_stops_an_idle_worker_after_mcp_use(real_redis_url: str, key_prefix: str,
                                                    processes) -> None:  # noqa: F811
    client = redis.Redis.from_url(real_redis_url)
    keys = Keys(prefix=key_prefix)
    server = {"name": "calculator", "transport": "stdio", "command": sys.executable, "args": [CALCULATOR],
              "timeout": 30}
    bot = publish_robot(client, key_prefix, f"stop-mcp-{uid()}", model="scripted/echo", mcp_servers=[server])
    worker = _worker(processes, real_redis_url, key_prefix, bot.name, "--in-flight", "4")
    try:
        network = create_network(f"stop-mcp-{uid()}")
        for i in range(3):
            network.task(f"t{i}", bot, mcp="inherit", tools=["add"])
        result = Coordinator(connection=client, keys=keys).submit(network, "add").wait(timeout=120)
        assert result.status == "completed"
        _stop(worker, "idle worker after MCP use")
    except Exception:
        print(processes.logs())
        raise
    assert worker.returncode == 0, processes.logs()
    assert _stopping(worker)["path"] == "idle", processes.logs()


def test_sigterm_drains_the_one_job_in_hand_then_stops(real_redis_url: str, key_prefix: str,
                                                       processes) -> None:  # noqa: F811
    client = redis.Redis.from_url(real_redis_url)
    keys = Keys(prefix=key_prefix)
    bot = publish_robot(client, key_prefix, f"stop-drain-{uid()}", model="scripted/sleep:3000")
    worker = _worker(processes, real_redis_url, key_prefix, bot.name, "--in-flight", "4")
    try:
        network = create_network(f"stop-drain-{uid()}")
        network.task("slow", bot)
        handle = Coordinator(connection=client, keys=keys).submit(network, "sleep")
        from rq.registry import StartedJobRegistry

        started = StartedJobRegistry(f"robot:{bot.name}", connection=client)
        wait_for(lambda: started.count > 0, timeout=90)  # the job is in the worker's hands
        _stop(worker, "worker draining one job")
        assert handle.wait(timeout=60).status == "completed"
    except Exception:
        print(processes.logs())
        raise
    assert worker.returncode == 0, processes.logs()
    assert _stopping(worker)["path"] == "drain", processes.logs()
