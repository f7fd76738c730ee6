"""Location transparency with real processes on a real Redis: a robot served by
``robot-lab worker`` answers a ``redis-cli XADD`` by calling its tool, and two parallel
tasks on two worker processes share memory (one writes ``k``, the other waits for it)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import redis as redis_lib

from robot_lab.keys import Keys
from robot_lab.memory.store import Memory
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.schemas import decode_message
from tests.fixtures.parity import APP, SKILL_ENV
from tests.test_parity import parity_env  # noqa: F401
from tests.worker_procs import VENV_BIN, child_env, delete_prefix, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def client(real_redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    conn = redis_lib.Redis.from_url(real_redis_url)
    yield conn
    delete_prefix(conn, key_prefix)
    conn.close()


@pytest.mark.not_hardened(reason="an unsigned envelope written with redis-cli is refused under signing.verify=require "
                                  "by design; the signed shell recipe is tests/test_security_signing.py's")
def test_redis_cli_message_makes_a_served_robot_call_its_tool(real_redis_url, key_prefix, client,
                                                              processes):  # noqa: F811
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli binary not installed")
    env = child_env(real_redis_url, key_prefix, **SKILL_ENV)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", "p-tools", "--app", APP], env, "worker")
    keys = Keys(key_prefix)
    inbox, reply_stream = keys.inbox("p-tools"), keys.inbox(f"cli-{uid()}")
    me = reply_stream.rsplit(":", 1)[1]  # a robot replies only to the sender's own inbox
    envelope = json.dumps({"v": 1, "id": "cli-0001", "to": "p-tools", "from": me,
                           "reply_to": me, "content": "add two numbers"})
    subprocess.run([cli, "-u", real_redis_url, "XADD", inbox, "*", "envelope", envelope],
                   capture_output=True, text=True, timeout=20, check=True)
    read = subprocess.run([cli, "-u", real_redis_url, "XREAD", "BLOCK", "60000", "STREAMS", reply_stream, "0-0"],
                          capture_output=True, text=True, timeout=90, check=True)
    if "envelope" not in read.stdout:
        print(processes.logs())
    [(_, fields)] = client.xrange(reply_stream)
    reply = decode_message(fields[b"envelope"])
    # the served robot offered its tool (scripted/echo calls it with a=0, b=0) and replied with the result
    assert reply.in_reply_to == "cli-0001" and reply.content == "echo: add two numbers\nTool results:\n- add: 0"


def test_two_parallel_tasks_on_two_worker_processes_share_memory(real_redis_url, key_prefix, client, processes,
                                                                 parity_env):  # noqa: F811
    env = child_env(real_redis_url, key_prefix, **SKILL_ENV)
    for robot in ("p-writer", "p-reader"):
        processes.start([str(VENV_BIN / "robot-lab"), "worker", robot, "--app", APP], env, robot)
    app = parity_env
    net = create_network("share")
    with net.parallel("both"):
        net.task("writer", app.build_robot("p-writer"), tools="inherit")
        net.task("reader", app.build_robot("p-reader"), tools="inherit")
    wait_for_workers(client, ["robot:p-writer", "robot:p-reader"], timeout=90)
    handle = Coordinator(connection=client).submit(net, "share")
    try:
        result = handle.wait(timeout=90)
    except Exception:
        print(processes.logs())
        raise
    assert result.status == "completed"
    assert result["reader"].tool_calls[0].content == {"data": "k=value-from-writer"}
    events = handle.events()
    workers = {e.task: e.data["worker"].split(":")[0] for e in events if e.event == "task.started"}
    assert workers["writer"] != workers["reader"]
    changed = [(e.task, e.data["key"], e.data["writer"]) for e in events if e.event == "memory.changed"]
    assert ("writer", "k", "p-writer") in changed and ("reader", "reader_saw", "p-reader") in changed
    log = Memory.for_run(result.run_id, redis=client).changes(0)
    assert [(c.key, c.writer) for c in log] == [("k", "p-writer"), ("reader_saw", "p-reader")]
