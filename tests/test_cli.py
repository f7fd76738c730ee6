"""The robot-lab command: fast, offline start-up; chat; schema; clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from robot_lab.cli import main

HEAVY = ("litellm", "rq", "fastembed", "mcp", "onnxruntime", "redis", "fakeredis", "openai", "httpx")


def test_help_and_import_load_no_heavy_library() -> None:
    code = (
        "import sys, robot_lab, robot_lab.cli\n"
        "from click.testing import CliRunner\n"
        "r = CliRunner().invoke(robot_lab.cli.main, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_commands_and_version() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "chat" in result.output and "schema" in result.output
    assert runner.invoke(main, ["--version"]).output.startswith("robot-lab, version")


def test_chat_streams_the_scripted_reply() -> None:
    result = CliRunner().invoke(main, ["chat", "hello robot"])
    assert result.exit_code == 0, result.output
    assert "echo: hello robot" in result.output


def test_chat_with_tool_and_json_output() -> None:
    result = CliRunner().invoke(main, ["chat", "--json", "--tool", "tests.fixtures.tools:add", "add please"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert data["tool_calls"][0]["tool"]["name"] == "add"


def test_chat_offline_guard_is_a_clear_cli_error() -> None:
    result = CliRunner().invoke(main, ["chat", "-m", "openai/gpt-4o-mini", "hi"])
    assert result.exit_code == 1
    assert "model requests are disabled" in result.output


def test_chat_bad_tool_path_is_a_clear_cli_error() -> None:
    result = CliRunner().invoke(main, ["chat", "--tool", "nowhere.mod:fn", "hi"])
    assert result.exit_code == 1
    assert "cannot import 'nowhere.mod:fn'" in result.output


def test_schema_rejects_unknown_name() -> None:
    result = CliRunner().invoke(main, ["schema", "nope"])
    assert result.exit_code == 2 and "Invalid value" in result.output
