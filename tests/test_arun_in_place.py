"""``Robot.arun`` runs a step in place when it has nothing to wait on, in a thread when it may.

A step of the run (the offered tools, the skills prompt, the learnings, compaction, the run's
files) goes to ``asyncio.to_thread`` only when its own predicate says it may block the event
loop (MCP servers, AgentSkills or a workspace, a learnings store, compaction on). Five hops a
run made ``arun`` cost twice a thread's run (bench/robot_floor.py); these tests hold both
sides: no hop where nothing waits, and every step that may wait still off the loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import robot_lab
from robot_lab.keys import default_keys
from robot_lab.runtime.robot import Robot
from robot_lab.runtime.robot.learning import Learning
from robot_lab.runtime.robot.mcp_attach import MCPAttachment
from robot_lab.runtime.robot.prompt import AppliedSkills, PromptAssembly
from robot_lab.skills.catalog import reset_default_catalog
from robot_lab.skills.matching import reset_default_matcher
from tests.test_skills import write_skill

SERVER = str(Path(__file__).parent / "mcp_servers" / "calculator.py")


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions ``arun`` sent to a thread."""
    sent: list[str] = []
    to_thread = asyncio.to_thread

    async def counting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        sent.append(getattr(fn, "__qualname__", repr(fn)))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    return sent


def on_thread(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[int]:
    """Wrap ``owner.name`` to record the thread each call runs on (behaviour unchanged)."""
    seen: list[int] = []
    original = getattr(owner, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return seen


async def arun_on_loop(robot: Robot, message: str, **kwargs: Any) -> tuple[Any, int]:
    return await robot.arun(message, **kwargs), threading.get_ident()


@pytest.fixture
def no_store_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose embedded store has not started (another test in this process may
    have started one): no learnings can be stored, so none are read."""
    from robot_lab import connection

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(connection, "_embedded_server", None)
    monkeypatch.setattr(connection, "_clients", {})


def test_an_arun_with_nothing_to_wait_on_takes_no_thread_hop(hops: list[str], no_store_yet: None) -> None:
    expected = Robot("calc", model="scripted/echo", local_tools=[add]).run("sum it", tools="inherit")
    result = asyncio.run(Robot("calc", model="scripted/echo", local_tools=[add]).arun("sum it", tools="inherit"))
    assert hops == ["Tool.call"]  # only the sync tool itself: user code may block
    assert result.reply == expected.reply and "- add: 0" in result.reply
    assert (result.input_tokens, result.output_tokens) == (expected.input_tokens, expected.output_tokens)
    hops.clear()
    result = asyncio.run(Robot("plain", model="scripted/echo").arun("hello"))
    assert hops == [] and result.reply == "echo: hello"


def test_learnings_in_a_store_are_read_off_the_loop(redis_client: Any, hops: list[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    robot_lab.build(name="arun-learner").learn("always greet")
    loads = on_thread(monkeypatch, Learning, "load")
    result, loop_thread = asyncio.run(arun_on_loop(Robot("arun-learner"), "hi"))
    assert "LEARNINGS FROM PREVIOUS RUNS:\n- always greet" in result.reply
    assert "Learning.inject" in hops
    assert loads and loop_thread not in loads


def test_preloaded_learnings_are_used_in_place(redis_client: Any, hops: list[str]) -> None:
    robot_lab.build(name="arun-preloaded").learn("check the order id")
    robot = Robot("arun-preloaded")
    raw = redis_client.hget(default_keys().memory("robot:arun-preloaded"), "learnings")
    assert raw is not None
    robot.preload_learnings(robot.memory, raw)  # what a network task's claim reads for it
    result = asyncio.run(robot.arun("hi"))
    assert "- check the order id" in result.reply
    assert "Learning.inject" not in hops


def test_a_compaction_callable_runs_off_the_loop(hops: list[str]) -> None:
    called: list[int] = []
    robot = Robot("compactor", model="scripted/echo")
    robot.config.auto_compact = lambda r: called.append(threading.get_ident())  # a user's compaction callable
    result, loop_thread = asyncio.run(arun_on_loop(robot, "hi"))
    assert result.reply == "echo: hi"
    assert called and loop_thread not in called
    assert "Robot._maybe_compact" in hops


def test_skills_and_their_workspace_are_applied_off_the_loop(tmp_path: Path, hops: list[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "skills"
    write_skill(root, "greeter", "Greet people warmly by their name.", "GREETER INSTRUCTIONS")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(root)]))
    monkeypatch.setenv("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
    reset_default_catalog()
    reset_default_matcher()
    try:
        applied = on_thread(monkeypatch, PromptAssembly, "with_agent_skills")
        finished = on_thread(monkeypatch, AppliedSkills, "finish")
        robot = robot_lab.build(name="desk", system_prompt="BASE", skills=["greeter"])
        result, loop_thread = asyncio.run(arun_on_loop(robot, "please greet people warmly by name"))
        assert result.workspace  # the run had a workspace: finish listed its files
        assert applied and loop_thread not in applied
        assert finished and loop_thread not in finished
    finally:
        reset_default_catalog()
        reset_default_matcher()


def test_mcp_tools_are_listed_off_the_loop(hops: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    listed = on_thread(monkeypatch, MCPAttachment, "tools_for_run")
    server = {"name": "calculator", "transport": "stdio", "command": sys.executable, "args": [SERVER], "timeout": 30}
    robot = robot_lab.build(name="arun-mcp", model="scripted/echo", mcp_servers=[server])
    try:
        result, loop_thread = asyncio.run(arun_on_loop(robot, "add 2 and 3", mcp="inherit"))
        assert "offered_tools" in hops
        assert listed and loop_thread not in listed
        assert result.error is None
    finally:
        robot._mcp.close()
    hops.clear()
    listed.clear()
    asyncio.run(robot.arun("no servers this time", mcp="none"))  # runtime none: nothing to connect
    assert "offered_tools" not in hops and listed  # listed in place, and it returned no tools
