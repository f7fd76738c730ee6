"""MCP: a robot uses the tools of an MCP server (examples/mcp_calculator.py, started over
stdio as a child process). Offline the scripted model calls `add` then `multiply`; with a
provider key the real model picks the tools itself.

    python examples/06_mcp.py
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")  # a story, not a service: warnings only (-> INFO to see more)

import robot_lab  # noqa: E402
from robot_lab.llm.scripted import register_script
from robot_lab.settings import get_settings

OFFLINE = get_settings().default_model().startswith("scripted/")
register_script("calc06", {"turns": [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
    {"tool_calls": [{"name": "multiply", "arguments": {"a": 5, "b": 7}}]},
    {"reply": "(2 + 3) x 7 = 35. Tool results:\n{tool_results}"},
]})

server = {"name": "calculator", "transport": "stdio", "command": sys.executable,
          "args": [str(Path(__file__).parent / "mcp_calculator.py")], "timeout": 30}
robot = robot_lab.build(name="mathbot", model="scripted/calc06" if OFFLINE else None,
                        system_prompt="Use the calculator tools for arithmetic.", mcp_servers=[server])
try:
    result = robot.run("What is 2 + 3, times 7?", mcp="inherit")
    for call in result.tool_calls:
        print(f"MCP tool {call.tool.name}({call.tool.input}) -> {call.data or call.error}")
    print(result.reply)
finally:
    robot.disconnect()
