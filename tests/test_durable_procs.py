"""Durable runs with real `robot-lab worker` processes on a real Redis: kill -9 in the middle
of a tool loop replays the step journal; a parked task is answered from another process
with the CLI and resumes on another worker; 100 parked runs in one worker with 4 slots."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.llm.recording import recorded_calls
from robot_lab.runtime.robot import build
from tests.redis_server import REPO_ROOT, wait_for
from tests.stopping import stopped
from tests.test_connection_redis_restart import aof_redis  # noqa: F401 - a private redis-server with AOF
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

SCRIPTS = REPO_ROOT / "tests" / "fixtures" / "scripts"
TOOLS = "tests.fixtures.durable_tools"


@pytest.fixture
def client(real_client):
    return real_client


def _pid_of(worker: str) -> int:
    match = re.match(r"robot-lab\..+\.(\d+)(\.\d+)?:\d+$", worker)
    assert match, worker
    return int(match.group(1))


def _events(store, name, task=None):
    return [e for _, e in store.events() if e.event == name and (task is None or e.task == task)]


def _env(real_redis_url, key_prefix, record: Path, **extra):
    return child_env(real_redis_url, key_prefix, ROBOT_LAB_SCRIPTS_DIR=str(SCRIPTS),
                     ROBOT_LAB_SCRIPTED_RECORD=str(record), REFUND_FILE=str(record.parent / "refunds.txt"), **extra)


def _calls(record: Path, robot: str) -> int:
    """Model calls the scripted model answered for ``robot`` (not the workers' warm-up calls)."""
    return sum(1 for c in recorded_calls(str(record)) if c.get("robot") == robot)


def _refund_lines(directory: Path) -> list[bytes]:
    """What the refund tools of the workers wrote (the outside world: a file, not robot-lab's
    Redis, where a worker's ACL user may not write a test's key)."""
    path = directory / "refunds.txt"
    return path.read_bytes().splitlines() if path.exists() else []


def _refunds(directory, run_id):
    return [v.decode().split("|")[0] for v in _refund_lines(directory) if run_id in v.decode()]


def test_kill_9_after_the_second_tool_call_replays_the_journal(client, real_redis_url, key_prefix, processes,
                                                              tmp_path):  # noqa: F811
    bot = build(f"refunder-{uid()}", model="scripted/refunds4", local_tools=[f"{TOOLS}:refund"])
    record = tmp_path / "calls.jsonl"
    env = _env(real_redis_url, key_prefix, record)
    publish_specs([bot.to_spec()], connection=client)
    for i in range(2):
        processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus"], env, f"w{i}")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=60)
    net = create_network("refunds")
    net.task("refund", bot, tools="inherit")
    coordinator = Coordinator(connection=client)

    baseline = coordinator.submit(net, "refund four orders")
    assert baseline.wait(timeout=60).reply == "refunds done"
    calls_without_kill = _calls(record, bot.name)
    assert calls_without_kill == 5
    assert _refunds(tmp_path, baseline.run_id) == ["A", "B", "C", "D"]

    handle = coordinator.submit(net, "refund four orders")
    store = handle.store
    steps_key = Keys(prefix=key_prefix).run_steps(handle.run_id, "refund")
    # steps 0..3 = model, refund A, model, refund B: journaled; the third model call sleeps
    wait_for(lambda: client.hlen(steps_key) >= 4, timeout=30, interval=0.02)
    assert _refunds(tmp_path, handle.run_id) == ["A", "B"]
    first = _events(store, "task.started", "refund")[0]
    os.kill(_pid_of(first.data["worker"]), signal.SIGKILL)
    result = handle.wait(timeout=90)

    assert result.reply == "refunds done"
    assert _refunds(tmp_path, handle.run_id) == ["A", "B", "C", "D"]  # each refund once
    calls_with_kill = _calls(record, bot.name) - calls_without_kill
    assert calls_with_kill <= calls_without_kill + 1  # only the model call in flight was made again
    starts = _events(store, "task.started", "refund")
    assert len(starts) == 2 and starts[0].data["worker"] != starts[1].data["worker"]
    # the second attempt replayed steps 0..3: they completed once on the run's stream
    completed = [e.data["index"] for e in _events(store, "step.completed", "refund")]
    assert sorted(completed) == list(range(9)) and len(completed) == 9
    # the idempotency key of each refund names its step, the same on every attempt
    keys = [v.decode().split("|")[1] for v in _refund_lines(tmp_path)
            if handle.run_id in v.decode()]
    assert keys == [f"run:{handle.run_id}:refund:{i}" for i in (1, 3, 5, 7)]


def _cli(env, *args, check=True):
    proc = subprocess.run([str(VENV_BIN / "robot-lab"), *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def test_ask_and_approve_answered_with_the_cli_resume_on_another_worker(client, real_redis_url, key_prefix,
                                                                        processes, tmp_path):  # noqa: F811
    bot = build(f"asker-{uid()}", model="scripted/ask_refund",
                local_tools=["robot_lab.runtime.durable.human:AskUser", f"{TOOLS}:big_refund"])
    record = tmp_path / "calls.jsonl"
    env = _env(real_redis_url, key_prefix, record)
    publish_specs([bot.to_spec()], connection=client)
    first = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus"], env, "w0")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=60)
    net = create_network("ask")
    net.task("ask", bot, tools="inherit")
    handle = Coordinator(connection=client).submit(net, "refund my order")
    wait_for(lambda: handle.states().get("ask") == "waiting", timeout=30, interval=0.05)
    # the parked task holds no lease and no job: the worker can go away
    assert not client.exists(Keys(prefix=key_prefix).run_lease(handle.run_id, "ask"))
    first.send_signal(signal.SIGTERM)
    assert stopped(first) == 0
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus"], env, "w1")

    listed = json.loads(_cli(env, "pending", "--json").stdout)
    assert [(r["run_id"], r["question"], r["choices"]) for r in listed] == [(handle.run_id, "Which order?", ["A1", "B2"])]
    status = json.loads(_cli(env, "status", "--json").stdout)
    assert [r["waiting"] for r in status["runs"] if r["run_id"] == handle.run_id] == [["ask"]]
    _cli(env, "answer", listed[0]["id"], "1", "--by", "alice")
    assert "already answered by alice" in _cli(env, "answer", listed[0]["id"], "2", check=False).stderr

    approval = wait_for(lambda: [r for r in json.loads(_cli(env, "pending", "--json").stdout)
                                 if r["kind"] == "approval"], timeout=30, interval=0.2)[0]
    assert approval["tool"] == "big_refund" and approval["arguments"] == {"order": "A1"}
    assert _refund_lines(tmp_path) == []  # not run before the approval
    _cli(env, "answer", handle.run_id, "--approve")
    result = handle.wait(timeout=60)

    assert "ask_user: A1" in result.reply and "refunded A1 (approved)" in result.reply
    assert [v.decode().split("|")[0] for v in _refund_lines(tmp_path)] == ["big:A1"]
    assert _calls(record, bot.name) == 3  # as without parking: no model call repeated
    resolved = _events(handle.store, "hitl.resolved", "ask")
    assert [e.data["by"] for e in resolved] == ["alice", f"cli:{os.environ.get('USER') or __import__('getpass').getuser()}"]
    pids = [_pid_of(e.data["worker"]) for e in _events(handle.store, "task.started", "ask")]
    assert pids[0] == first.pid and set(pids[1:]) == {pids[1]} != {first.pid}  # resumed on the other worker


def test_a_hundred_parked_runs_in_one_worker_with_four_slots_all_resume(client, real_redis_url, key_prefix,
                                                                        processes, tmp_path):  # noqa: F811
    bot = build(f"many-{uid()}", model="scripted/ask_refund",
                local_tools=["robot_lab.runtime.durable.human:AskUser", f"{TOOLS}:big_refund"])
    env = _env(real_redis_url, key_prefix, tmp_path / "calls.jsonl")
    publish_specs([bot.to_spec()], connection=client)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus", "--in-flight", "4"], env, "w")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=60)
    net = create_network("many")
    net.task("ask", bot, tools="inherit")
    coordinator = Coordinator(connection=client)
    handles = [coordinator.submit(net, f"order {i}") for i in range(100)]
    wait_for(lambda: all(h.states().get("ask") == "waiting" for h in handles), timeout=120, interval=0.2)
    from robot_lab.network.human_input import pending

    keys = Keys(prefix=key_prefix)
    assert len(pending(client, keys)) == 100  # more parked runs than slots: none holds one
    for h in handles:
        h.answer("2")
    wait_for(lambda: len(pending(client, keys)) == 100, timeout=120, interval=0.2)  # now the approvals
    for h in handles:
        h.answer(approve=True)
    for h in handles:
        assert h.wait(timeout=120).reply.endswith("refunded A1 (approved)")
    assert len(_refund_lines(tmp_path)) == 100


def test_a_parked_run_survives_a_redis_crash_with_aof_and_new_workers(aof_redis, key_prefix, processes,
                                                                      tmp_path):  # noqa: F811
    import redis

    client = redis.Redis.from_url(aof_redis.url)
    bot = build(f"survivor-{uid()}", model="scripted/ask_refund",
                local_tools=["robot_lab.runtime.durable.human:AskUser", f"{TOOLS}:big_refund"])
    record = tmp_path / "calls.jsonl"
    env = _env(aof_redis.url, key_prefix, record)
    publish_specs([bot.to_spec()], connection=client, keys=Keys(prefix=key_prefix))
    first = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus"], env, "w0")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=60)
    net = create_network("survive")
    net.task("ask", bot, tools="inherit")
    handle = Coordinator(connection=client, keys=Keys(prefix=key_prefix)).submit(net, "refund my order")
    wait_for(lambda: handle.states().get("ask") == "waiting", timeout=30, interval=0.05)
    first.send_signal(signal.SIGTERM)
    assert stopped(first) == 0
    aof_redis.stop(signal.SIGKILL)  # a crash: the AOF (appendfsync always) has every acknowledged write
    aof_redis.start()
    client = redis.Redis.from_url(aof_redis.url)
    handle = Coordinator(connection=client, keys=Keys(prefix=key_prefix)).attach(handle.run_id)
    assert handle.states() == {"ask": "waiting"}
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus"], env, "w1")
    _cli(env, "answer", handle.run_id, "B2")
    wait_for(lambda: [r for r in json.loads(_cli(env, "pending", "--json").stdout) if r["kind"] == "approval"],
             timeout=30, interval=0.2)
    _cli(env, "answer", handle.run_id, "--deny", "not today")
    result = handle.wait(timeout=60)
    assert "ask_user: B2" in result.reply and "the user denied this call: not today" in result.reply
    assert _calls(record, bot.name) == 3


def test_an_unanswered_question_times_out_to_its_default_in_a_real_worker(client, real_redis_url, key_prefix,
                                                                         processes, tmp_path):  # noqa: F811
    bot = build(f"patient-{uid()}", model="scripted/ask_default", local_tools=["robot_lab.runtime.durable.human:AskUser"],
                config={"input_timeout": 0.5})
    env = _env(real_redis_url, key_prefix, tmp_path / "calls.jsonl")
    publish_specs([bot.to_spec()], connection=client)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--no-bus"], env, "w")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=60)
    net = create_network("timeout")
    net.task("ask", bot, tools="inherit")
    handle = Coordinator(connection=client).submit(net, "pick a size")
    wait_for(lambda: handle.states().get("ask") == "waiting", timeout=30, interval=0.05)
    # nobody answers: the worker's own sweeper answers with the default once input_timeout passed
    wait_for(lambda: handle.status == "completed", timeout=60, interval=0.1)
    assert handle.result().reply == "size - ask_user: M"
    assert [e.data["by"] for e in _events(handle.store, "hitl.resolved", "ask")] == ["timeout"]


def test_a_served_robot_in_a_real_worker_asks_over_the_bus(client, real_redis_url, key_prefix, processes,
                                                           tmp_path):  # noqa: F811
    from robot_lab.bus import Bus

    bot = build(f"desk-{uid()}", model="scripted/ask_refund",
                local_tools=["robot_lab.runtime.durable.human:AskUser", f"{TOOLS}:big_refund"])
    record = tmp_path / "calls.jsonl"
    env = _env(real_redis_url, key_prefix, record)
    publish_specs([bot.to_spec()], connection=client)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name], env, "w")
    bus = Bus(client, keys=Keys(prefix=key_prefix))
    wait_for(lambda: client.sismember(Keys(prefix=key_prefix).registry(), bot.name), timeout=60, interval=0.1)
    question = bus.request(bot.name, "refund please", timeout=60, from_="client", conversation_id="t-1")
    assert question.kind == "input_required" and question.content["question"] == "Which order?"
    approval = bus.request(bot.name, "1", timeout=60, from_="client", kind="answer",
                           in_reply_to=question.content["request_id"], conversation_id="t-1")
    assert approval.kind == "input_required" and approval.content["kind"] == "approval"
    assert approval.content["tool"] == "big_refund" and approval.content["arguments"] == {"order": "A1"}
    final = bus.request(bot.name, {"approved": True}, timeout=60, from_="client", kind="answer",
                        in_reply_to=approval.content["request_id"], conversation_id="t-1")
    assert final.kind == "reply" and "refunded A1 (approved)" in final.content
    assert _calls(record, bot.name) == 3  # each model call once across the two parks
    assert [v.decode().split("|")[0] for v in _refund_lines(tmp_path)] == ["big:A1"]


def test_a_network_task_delegating_to_a_served_robot_that_asks_parks_and_resumes_on_another_worker(
        client, real_redis_url, key_prefix, processes, tmp_path):  # noqa: F811
    """The delegatee (served by its own worker) asks which order, then for an approval: each
    question parks the delegating network task, is answered with the CLI, and the task --
    resumed on a fresh worker the first time -- sends the answer on over the bus."""
    desk = build("delegation-desk", model="scripted/ask_refund",
                 local_tools=["robot_lab.runtime.durable.human:AskUser", f"{TOOLS}:big_refund"])
    boss = build(f"boss-{uid()}", model="scripted/delegate_to_desk", local_tools=[f"{TOOLS}:ask_desk"])
    record = tmp_path / "calls.jsonl"
    env = _env(real_redis_url, key_prefix, record)
    publish_specs([desk.to_spec(), boss.to_spec()], connection=client)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", desk.name], env, "desk")
    first = processes.start([str(VENV_BIN / "robot-lab"), "worker", boss.name, "--no-bus"], env, "boss0")
    wait_for(lambda: client.sismember(Keys(prefix=key_prefix).registry(), desk.name), timeout=60, interval=0.1)
    wait_for_workers(client, [f"robot:{boss.name}"], timeout=60)
    net = create_network("delegating")
    net.task("boss", boss, tools="inherit")
    handle = Coordinator(connection=client).submit(net, "go")
    wait_for(lambda: handle.states().get("boss") == "waiting", timeout=60, interval=0.05)
    listed = json.loads(_cli(env, "pending", "--json").stdout)
    [question] = [r for r in listed if r.get("run_id") == handle.run_id]  # the desk's own waits too
    assert (question["question"], question["choices"]) == ("Which order?", ["A1", "B2"])
    first.send_signal(signal.SIGTERM)  # the parked task holds no worker: a fresh one resumes it
    assert stopped(first) == 0
    processes.start([str(VENV_BIN / "robot-lab"), "worker", boss.name, "--no-bus"], env, "boss1")
    _cli(env, "answer", handle.run_id, "1")
    approval = wait_for(lambda: [r for r in json.loads(_cli(env, "pending", "--json").stdout)
                                 if r["kind"] == "approval" and r.get("run_id") == handle.run_id],
                        timeout=60, interval=0.2)[0]
    assert "big_refund" in approval["question"]
    assert _refund_lines(tmp_path) == []  # the desk's tool waits for the approval
    _cli(env, "answer", handle.run_id, "--approve")
    result = handle.wait(timeout=60)
    assert result.reply.startswith("desk says - ask_desk: done: ") and "refunded A1 (approved)" in result.reply, \
        result.reply
    assert [v.decode().split("|")[0] for v in _refund_lines(tmp_path)] == ["big:A1"]
    assert _calls(record, desk.name) == 3 and _calls(record, boss.name) == 2  # no model call made twice
