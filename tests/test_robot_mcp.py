"""A robot with a real stdio MCP server: lists and calls its tools; a broken server never
fails the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import robot_lab

SERVER = str(Path(__file__).parent / "mcp_servers" / "calculator.py")


def calculator(name: str = "calculator") -> dict:
    return {"name": name, "transport": "stdio", "command": sys.executable, "args": [SERVER], "timeout": 30}


def test_robot_lists_and_calls_mcp_tools_in_a_run() -> None:
    robot = robot_lab.build(name="mathbot", mcp_servers=[calculator()])
    try:
        assert robot.run("no tools asked").tool_calls == []  # mcp defaults to none: nothing connects
        assert robot.failed_mcp_server_names == []
        result = robot.run("add please", mcp="inherit", tools=["add"])
        assert [r.tool.name for r in result.tool_calls] == ["add"]
        assert result.tool_calls[0].data == "0"  # scripted args a=0, b=0 computed by the server
        everything = robot.run("all of them", mcp="inherit")
        assert {"add", "shout"} <= {r.tool.name for r in everything.tool_calls}
    finally:
        robot.disconnect()


def test_missing_server_command_is_logged_and_the_run_completes(capsys: pytest.CaptureFixture[str]) -> None:
    broken = {"name": "ghost", "transport": "stdio", "command": "/nonexistent/mcp-server-binary", "timeout": 5}
    robot = robot_lab.build(name="resilient", mcp_servers=[broken])
    try:
        result = robot.run("still answer", mcp="inherit")
        assert result.reply == "echo: still answer"
        assert robot.failed_mcp_server_names == ["ghost"]
        assert "ghost" in capsys.readouterr().err
    finally:
        robot.disconnect()


def test_bad_mcp_config_fails_at_build_time() -> None:
    with pytest.raises(robot_lab.ConfigurationError, match="stdio"):
        robot_lab.build(name="x", mcp_servers=[{"name": "bad", "transport": "stdio"}])
