"""The memory a robot runs with: the run's shared memory in a network task,
``task(memory=...)``, ``run(memory=...)``; tools reach it through ``current_memory()`` (``current_turn()``) and
hooks through ``ctx.memory``, always writing as the robot."""

from __future__ import annotations

import fakeredis
import pytest

import robot_lab
from robot_lab import connection
from robot_lab.errors import ConfigurationError
from robot_lab.memory.store import Memory
from robot_lab.network.dsl import Network, create_network
from robot_lab.runtime.robot import build
from robot_lab.runtime.robot.context import current_memory
from tests.fixtures import hooks as hook_fixtures
from tests.fixtures.parity import write_k


@pytest.fixture(autouse=True)
def _fresh_embedded() -> None:
    connection.reset_embedded()
    hook_fixtures.SCOPES.clear()


def test_task_memory_names_the_scope_the_robot_writes_to() -> None:
    client = fakeredis.FakeRedis()
    net = create_network("notes")
    net.task("w", build("note-writer", model="scripted/echo", local_tools=[write_k]), tools="inherit",
             memory="team-notes")
    result = net.run("write", connection=client)
    assert result.status == "completed"
    notes = Memory("team-notes", redis=client)
    assert notes.get("k") == "value-from-writer"
    assert [(c.key, c.writer) for c in notes.changes(0)] == [("k", "note-writer")]
    assert Memory.for_run(result.run_id, redis=client).get("k") is None  # not the run's scope


def test_hooks_see_the_runs_memory_writing_as_the_robot() -> None:
    net = create_network("seen")
    net.on("tests.fixtures.hooks:MemoryScopes")
    net.task("only", build("watched", model="scripted/echo"))
    result = net.run("hi", connection=fakeredis.FakeRedis())
    assert hook_fixtures.SCOPES == [f"task:run:{result.run_id}", f"run:run:{result.run_id}:watched"]


def test_run_memory_argument_in_process() -> None:
    seen: list[tuple[str, str | None]] = []

    def probe() -> str:
        """Report the memory in use."""
        memory = current_memory()
        seen.append((memory.scope, memory.current_writer))
        memory.set("touched", True)
        return "ok"

    robot = build("prober", model="scripted/echo", local_tools=[probe])
    robot.run("a", tools="inherit")  # no argument: the robot's own memory
    robot.run("b", tools="inherit", memory="scratch")  # a scope name
    shared = Memory("shared-notes")
    robot.run("c", tools="inherit", memory=shared)  # a Memory
    robot.run("d", tools="inherit", memory={"seed": 1})  # a mapping merged into the robot's own
    assert seen == [("robot:prober", "prober"), ("scratch", "prober"), ("shared-notes", "prober"),
                    ("robot:prober", "prober")]
    assert shared.get("touched") is True and robot.memory.get("seed") == 1
    assert shared.current_writer is None  # the writer is set for the run only


def test_a_tool_reaches_its_turn_through_current_turn_or_its_first_name_current_run() -> None:
    seen: list[tuple[str, str, bool]] = []

    def probe() -> str:
        """Report the turn in progress."""
        turn = robot_lab.current_turn()
        seen.append((type(turn).__name__, turn.robot.name, robot_lab.current_run() is turn))
        return "ok"

    build("prober", model="scripted/echo", local_tools=[probe]).run("a", tools="inherit")
    assert seen == [("TurnContext", "prober", True)]


def test_current_memory_outside_a_turn_is_a_clear_error() -> None:
    for outside in (current_memory, robot_lab.current_turn, robot_lab.current_run):
        with pytest.raises(ConfigurationError, match=r"^current_turn\(\) is only available inside a robot's turn"):
            outside()


def test_task_memory_and_mcp_in_yaml_form_and_bad_values() -> None:
    net = Network.from_dict({"name": "y", "tasks": [
        {"name": "a", "robot": "r", "memory": "team", "mcp": "inherit", "tools": ["add"]}]})
    [spec] = net.spec.tasks
    assert (spec.memory, spec.mcp, spec.tools) == ("team", "inherit", ["add"])
    with pytest.raises(ConfigurationError, match="memory must be a scope name"):
        create_network("z").task("a", "r", memory="")
    with pytest.raises(ConfigurationError, match="mcp must be 'none', 'inherit' or a list"):
        create_network("z").task("a", "r", mcp="everything")
