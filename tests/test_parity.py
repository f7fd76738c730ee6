"""One robot, wherever it runs: a table of scenarios, each run three ways --

* ``inprocess``: ``Robot.run`` in this process, as a user calls it;
* ``embedded``: a network run on fakeredis with in-process rq workers;
* ``procs``: the same network on a real Redis, executed by two real ``robot-lab worker``
  processes (``--app tests.fixtures.parity:make_app``)

-- and the same transcript asserted equal: tool calls and their outputs, memory changes
(key, value, writer), the config in effect at each model call (recorded by the scripted
model: model, parameters, offered tools, provider, system prompt), the reply, the streamed
text and the robot's learnings.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis as redis_lib

from robot_lab import connection
from robot_lab.memory.store import Memory
from robot_lab.llm import recording
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import Network, create_network
from robot_lab.skills.catalog import reset_default_catalog
from robot_lab.skills.matching import reset_default_matcher
from tests.fixtures.parity import APP, SKILL_ENV
from tests.worker_procs import VENV_BIN, child_env, delete_prefix, processes, uid, wait_for_workers  # noqa: F401

@dataclass
class Task:
    name: str
    robot: str
    tools: str | list[str] | None = None
    mcp: str | None = None
    config: dict[str, Any] | None = None


@dataclass
class Scenario:
    name: str
    message: str
    tasks: list[Task]
    network_config: dict[str, Any] | None = None
    parallel: bool = False
    context: dict[str, Any] = field(default_factory=dict)


SCENARIOS = [
    Scenario("tools", "sum these", [Task("t", "p-tools", tools="inherit")]),
    # a name list filters MCP tools too (the calculator also has tools that crash it on purpose)
    Scenario("mcp", "use the calculator", [Task("t", "p-mcp", tools=["add", "shout"], mcp="inherit")]),
    Scenario("skill_match", "please greet people warmly by name", [Task("t", "p-skill-match", tools="inherit")]),
    Scenario("skill_tool", "do what you can", [Task("t", "p-skill-tool", tools="inherit")]),
    Scenario("template", "hello", [Task("t", "p-template")], context={"tone": "dry"}),
    Scenario("cascade", "go", [Task("t", "p-cascade", config={"temperature": 0.25})],
             network_config={"model": "scripted/text:from-network", "top_p": 0.5, "max_tokens": 10}),
    Scenario("memory", "share", [Task("writer", "p-writer", tools="inherit"),
                                 Task("reader", "p-reader", tools="inherit")], parallel=True),
    Scenario("budget", "sum", [Task("t", "p-budget", tools="inherit")]),
    Scenario("hooks", "sum", [Task("t", "p-hooks", tools="inherit")]),
    Scenario("learn", "learn something", [Task("t", "p-learn", tools="inherit")]),
]
ROBOTS = sorted({t.robot for s in SCENARIOS for t in s.tasks})


@pytest.fixture
def parity_env(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for key, value in SKILL_ENV.items():
        monkeypatch.setenv(key, value)
    reset_default_catalog()
    reset_default_matcher()
    from robot_lab.app import load_app

    yield load_app(APP)
    reset_default_catalog()
    reset_default_matcher()


def build_network(sc: Scenario, app: Any) -> Network:
    net = create_network(f"parity-{sc.name}", config=sc.network_config)
    if sc.parallel:
        with net.parallel("siblings"):
            for t in sc.tasks:
                net.task(t.name, app.build_robot(t.robot), tools=t.tools, mcp=t.mcp, config=t.config)
    else:
        for t in sc.tasks:
            net.task(t.name, app.build_robot(t.robot), tools=t.tools, mcp=t.mcp, config=t.config)
    return net


def normalized(call: dict[str, Any]) -> dict[str, Any]:
    """A recorded call with the per-run skill workspace path replaced (it names the run)."""
    system = call.get("system")
    if system:
        call = {**call, "system": re.sub(r"Working Directory: \S+", "Working Directory: <workspace>", system)}
    return call


def transcript(results: dict[str, Any], streamed: dict[str, str], changes: list[Any], calls: list[dict[str, Any]],
               learnings: Any) -> dict[str, Any]:
    tasks = {}
    for name, r in sorted(results.items()):
        tasks[name] = {
            "reply": r.reply,
            "failed": r.failed,
            "tool_calls": [(m.tool.name, m.tool.input, m.content) for m in r.tool_calls],
            "streamed": streamed.get(name, ""),
        }
    return {
        "tasks": tasks,
        "memory": sorted((c.key, json.dumps(c.value), c.writer) for c in changes if c.op == "set"),
        # a worker's own warm-up call (no robot) is not part of any scenario
        "calls": sorted(json.dumps(normalized(c), sort_keys=True) for c in calls if c.get("robot")),
        "learnings": learnings,
    }


def run_inprocess(sc: Scenario, app: Any) -> dict[str, Any]:
    """``Robot.run`` here, bound as a network task is: the run's memory, the network's and
    the task's config, the task's tools and MCP policy."""
    connection.reset_embedded()
    recording.clear_recorded_calls()
    memory = Memory.for_run(f"inproc-{uid()}", network_name=f"parity-{sc.name}")
    since = memory.version
    results: dict[str, Any] = {}
    streamed: dict[str, str] = {}

    def one(t: Task) -> None:
        chunks: list[str] = []
        robot = app.build_robot(t.robot)
        results[t.name] = robot.run_safely(
            sc.message, tools=t.tools or "none", mcp=t.mcp or "none", network_config=sc.network_config,
            task_config=t.config, memory=memory, task=t.name, on_content=lambda c: chunks.append(c.content),
            **sc.context,
        )
        streamed[t.name] = "".join(chunks)

    threads = [threading.Thread(target=one, args=(t,)) for t in sc.tasks]
    for th in threads:
        th.start()
        if not sc.parallel:
            th.join()
    for th in threads:
        th.join(90)
    learnings = Memory.for_robot("p-learn").get("learnings")
    return transcript(results, streamed, memory.changes(since), recording.recorded_calls(), learnings)


def network_transcript(handle: Any, result: Any, client: Any, calls: list[dict[str, Any]],
                       learnings: Any) -> dict[str, Any]:
    streamed: dict[str, str] = {}
    for e in handle.events():
        if e.event == "text.delta":
            streamed[e.task] = streamed.get(e.task, "") + e.data["delta"]
    changes = Memory.for_run(result.run_id, redis=client).changes(0)
    return transcript(result.context, streamed, changes, calls, learnings)


def run_embedded(sc: Scenario, app: Any) -> dict[str, Any]:
    connection.reset_embedded()
    recording.clear_recorded_calls()
    client = connection.get_redis()  # the embedded fakeredis: workers run as threads here
    assert isinstance(client, fakeredis.FakeRedis)
    net = build_network(sc, app)
    result = net.run(sc.message, connection=client, timeout=90, **sc.context)
    handle = Coordinator(connection=client).attach(result.run_id)
    learnings = Memory.for_robot("p-learn").get("learnings")
    return network_transcript(handle, result, client, recording.recorded_calls(), learnings)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_in_process_and_embedded_workers_agree(sc: Scenario, parity_env: Any) -> None:
    inprocess = run_inprocess(sc, parity_env)
    embedded = run_embedded(sc, parity_env)
    assert inprocess == embedded
    check_scenario(sc, inprocess)


def check_scenario(sc: Scenario, t: dict[str, Any]) -> None:
    """What each scenario must show (so equal transcripts cannot both be empty)."""
    calls = [json.loads(c) for c in t["calls"]]
    first = t["tasks"][sc.tasks[0].name]
    if sc.name == "tools":
        assert [c[0] for c in first["tool_calls"]] == ["add"] and not first["failed"]
    elif sc.name == "mcp":
        assert [c[0] for c in first["tool_calls"]] == ["add", "shout"]
        assert first["tool_calls"][1][2] == {"data": "A"}  # the real server upper-cased "a"
    elif sc.name == "skill_match":
        assert any(c["system"].startswith("GREETER INSTRUCTIONS\n\nBASE") for c in calls)
        assert "greeter__greet" in [c[0] for c in first["tool_calls"]]
    elif sc.name == "skill_tool":
        assert [c[0] for c in first["tool_calls"]][0] == "Skill"
    elif sc.name == "template":
        assert calls[0]["system"].endswith("You help customers of Acme in a dry tone.")
        assert calls[0]["params"]["temperature"] == 0.2  # front matter
    elif sc.name == "cascade":
        assert calls == [{"model": "scripted/text:from-network", "params": {"temperature": 0.25, "top_p": 0.5,
                          "max_tokens": 100}, "tools": [], "provider": None, "robot": "p-cascade",
                          "request": "go", "system": None}]
    elif sc.name == "memory":
        assert ("k", '"value-from-writer"', "p-writer") in t["memory"]
        assert ("reader_saw", '"value-from-writer"', "p-reader") in t["memory"]
        assert t["tasks"]["reader"]["tool_calls"][0][2] == {"data": "k=value-from-writer"}
    elif sc.name == "budget":
        assert first["failed"] and "Token budget exceeded" in first["reply"]
    elif sc.name == "hooks":
        assert ("hook_before_run", '"p-hooks"', "p-hooks") in t["memory"]
        assert ("hook_tool", '"add"', "p-hooks") in t["memory"]
    elif sc.name == "learn":
        assert t["learnings"] == ["always add carefully"]
    for name, task in t["tasks"].items():
        if not task["failed"]:
            assert task["streamed"] == task["reply"], name  # streaming events carry the reply


@pytest.mark.slow
def test_real_worker_processes_agree_with_in_process(parity_env, real_redis_url, key_prefix, monkeypatch,
                                                     processes, tmp_path):  # noqa: F811
    """Every scenario on two real ``robot-lab worker`` processes serving all the robots."""
    record = tmp_path / "calls.jsonl"
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_SCRIPTED_RECORD=str(record), **SKILL_ENV)
    for i in (1, 2):
        processes.start([str(VENV_BIN / "robot-lab"), "worker", *ROBOTS, "--app", APP], env, f"worker{i}")
    client = redis_lib.Redis.from_url(real_redis_url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    mismatches = []
    try:
        wait_for_workers(client, [f"robot:{r}" for r in ROBOTS], timeout=90)
        for sc in SCENARIOS:
            expected = run_inprocess(sc, parity_env)
            record.write_text("")
            handle = Coordinator(connection=client).submit(build_network(sc, parity_env), sc.message,
                                                           context=sc.context)
            try:
                result = handle.wait(timeout=90)
            except Exception:
                print(processes.logs())
                raise
            learnings = Memory.for_robot("p-learn", redis=client).get("learnings")
            got = network_transcript(handle, result, client, recording.recorded_calls(str(record)), learnings)
            if got != expected:
                mismatches.append((sc.name, expected, got))
            if sc.name == "memory":
                workers = {e.task: e.data["worker"] for e in handle.events() if e.event == "task.started"}
                assert workers["writer"].split(":")[0] != workers["reader"].split(":")[0]  # two processes
                writers = {(e.data["key"], e.data["writer"]) for e in handle.events() if e.event == "memory.changed"}
                assert {("k", "p-writer"), ("reader_saw", "p-reader")} <= writers
        assert not mismatches, json.dumps(mismatches, indent=1, default=str)[:6000]
    finally:
        delete_prefix(client, key_prefix)
        client.close()
