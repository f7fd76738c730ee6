"""Networks and the fleet-wide rails: network hooks fire where the work happens, a
network-run budget is shared by every task, a loop bouncing between robots is seen."""

from __future__ import annotations

import fakeredis
import pytest

from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.fixtures import hooks as fixture_hooks
from tests.fixtures.tools import add


@pytest.fixture(autouse=True)
def _events():
    fixture_hooks.EVENTS.clear()
    yield
    fixture_hooks.EVENTS.clear()


def test_network_hooks_fire_for_the_run_each_task_and_robot() -> None:
    net = create_network("hooked")
    net.on("tests.fixtures.hooks:NetworkRecorder")
    net.task("first", build("hk-first", model="scripted/text:one"))
    net.task("second", build("hk-second", model="scripted/echo"), depends_on="first")
    assert net.spec.hooks == ["tests.fixtures.hooks:NetworkRecorder"]
    result = net.run("go", connection=fakeredis.FakeRedis())
    assert result.status == "completed"
    events = fixture_hooks.EVENTS
    assert events[0] == "network:hooked"
    assert events.index("task:first") < events.index("robot_run:hk-first") < events.index("task:second")
    assert "robot_run:hk-second" in events


def test_network_token_budget_is_shared_by_all_tasks() -> None:
    net = create_network("thrifty", config={"token_budget": 60})
    net.task("a", build("bud-a", model="scripted/echo"))
    net.task("b", build("bud-b", model="scripted/echo"), depends_on="a")
    net.task("c", build("bud-c", model="scripted/echo"), depends_on="b")
    result = net.run("a message long enough to use a fair share of the budget " * 2, connection=fakeredis.FakeRedis())
    errors = [r.error or "" for r in result.context.values()]
    assert any("budget" in e.lower() and "run:" in e for e in errors), errors
    assert result.states["a"] == "done"


def test_a_loop_across_robots_of_one_run_gets_the_warning() -> None:
    from robot_lab.network.coordinator import Coordinator

    connection = fakeredis.FakeRedis()
    net = create_network("loopy")
    net.task("a", build("loop-a", model="scripted/loop:add", local_tools=[add], max_tool_rounds=2), tools="inherit")
    net.task("b", build("loop-b", model="scripted/loop:add", local_tools=[add], max_tool_rounds=2),
             depends_on="a", tools="inherit")
    result = net.run("go", connection=connection)
    assert result.states == {"a": "failed", "b": "failed"}  # both stopped by max_tool_rounds
    outputs = [
        (e.task, str(e.data.get("output")))
        for e in Coordinator(connection=connection).attach(result.run_id).events()
        if e.event == "tool_call.completed"
    ]
    # robot a alone never reaches the threshold of 3; b's first call is the run's third `add`
    assert [task for task, _ in outputs] == ["a", "a", "b", "b"]
    assert all("⚠️" not in out for _, out in outputs[:2])
    assert "⚠️ Tool 'add' has been called 3+ times consecutively" in outputs[2][1]


def test_cluster_key_layout_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cluster layout, coordinator and workers agree on hash-tagged run keys (a real
    Redis Cluster is not available here; this checks the layout, not the cluster)."""
    monkeypatch.setenv("ROBOT_LAB_CLUSTER", "true")
    connection = fakeredis.FakeRedis()
    net = create_network("clustered")
    net.task("a", build("cl-a", model="scripted/text:one"))
    net.task("b", build("cl-b", model="scripted/echo"), depends_on="a")
    result = net.run("go", connection=connection)
    assert result.status == "completed" and result.reply == "echo: one"
    run_keys = {k.decode() for k in connection.scan_iter(match=f"robot_lab:run:*{result.run_id}*")}
    assert run_keys and all(f"{{{result.run_id}}}" in k for k in run_keys)
