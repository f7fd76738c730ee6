"""MCP connections are per worker process, not per robot object: robots built per network
task or per in-flight slot share one connection (one stdio server process) per server, which
is closed when idle, when the pool is full, and when the worker shuts down."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.mcp.pool import MCPPool
from robot_lab.runtime.robot import build
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

SERVER = str(Path(__file__).parent / "mcp_servers" / "calculator.py")


def calculator() -> dict:
    return {"name": "calculator", "transport": "stdio", "command": sys.executable, "args": [SERVER], "timeout": 30}


def server_children(pid: int) -> list[int]:
    """Live calculator server processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z" and SERVER.encode() in cmdline:
            found.append(int(entry))
    return found


def test_robots_of_one_spec_share_a_connection_across_runs() -> None:
    others = set(server_children(os.getpid()))  # servers of other tests in this process
    pool = MCPPool(max_size=4, idle_timeout=60)
    try:
        managers = set()
        for _ in range(3):  # three robots, as a worker builds them per task
            robot = build("pooled", mcp_servers=[calculator()])
            with pool.lease(robot.name, robot.mcp_servers) as manager:
                robot._mcp._manager = manager  # what Robot.shared_mcp does, on this pool
                result = robot.run("add", mcp="inherit", tools=["add"])
                assert [r.tool.name for r in result.tool_calls] == ["add"]
                managers.add(id(manager))
        assert len(managers) == 1 and len(pool) == 1
        assert len(set(server_children(os.getpid())) - others) == 1
    finally:
        pool.close()
    wait_for(lambda: not set(server_children(os.getpid())) - others)


def test_an_idle_connection_is_closed_and_the_next_run_reconnects() -> None:
    others = set(server_children(os.getpid()))

    def ours() -> set[int]:
        return set(server_children(os.getpid())) - others

    pool = MCPPool(max_size=4, idle_timeout=0.3)
    try:
        with pool.lease("idle", [calculator()]) as manager:
            assert [t.name for t in manager.tools()][:1] == ["add"]
            time.sleep(0.6)  # in use: the reaper leaves it alone however long it takes
            assert manager.clients and len(pool) == 1
        wait_for(lambda: len(pool) == 0)  # released and idle: closed by the reaper
        wait_for(lambda: not ours())
        with pool.lease("idle", [calculator()]) as manager:
            assert manager.tools() and len(ours()) == 1
    finally:
        pool.close()


def test_past_max_size_the_least_recently_used_idle_manager_is_closed() -> None:
    pool = MCPPool(max_size=1, idle_timeout=60)
    try:
        with pool.lease("a", [calculator()]) as first:
            first.tools()
            with pool.lease("b", [calculator()]) as second:  # both in use: over the bound, kept
                second.tools()
                assert len(pool) == 2
            assert len(pool) == 1  # b released: trimmed at once
        assert len(pool) == 1 and not second.clients and first.clients
    finally:
        pool.close()


@pytest.mark.slow
def test_a_worker_runs_20_mcp_tasks_on_one_server_process_and_stops_it_on_shutdown(  # noqa: F811
        real_client, real_redis_url, key_prefix, processes) -> None:
    from robot_lab.runtime.registry import publish_specs

    keys = Keys(prefix=key_prefix)
    bot = build(f"mcp-{uid()}", model="scripted/echo", mcp_servers=[calculator()])
    publish_specs([bot.to_spec()], connection=real_client, keys=keys)
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--in-flight", "4"],
                             child_env(real_redis_url, key_prefix), "worker")
    coordinator = Coordinator(connection=real_client, keys=keys)
    pids = []  # the server process each task's tool call reached (its `pid` tool)
    for batch in range(4):  # 4 runs of 5 parallel tasks: tasks on several in-flight slots at once
        network = create_network(f"mcp-fan-{batch}")
        for i in range(5):
            network.task(f"t{i}", bot, mcp="inherit", tools=["pid"])
        result = coordinator.submit(network, "which server?").wait(timeout=120)
        assert result.status == "completed", processes.logs()
        for task_result in result.context.values():
            [call] = task_result.tool_calls
            pids.append(int(str(call.data).split()[0]))  # (the run-wide loop guard appends a warning)
        assert server_children(worker.pid) == [pids[0]], (batch, pids, processes.logs())
    assert len(pids) == 20 and set(pids) == {pids[0]}
    worker.send_signal(signal.SIGTERM)
    worker.wait(60)
    assert worker.returncode == 0, processes.logs()
    wait_for(lambda: not server_children(worker.pid))
