"""What a fresh process loads for its first run: a robot built and run in process, with a
tool call on the scripted model and no memory use, imports neither redis-py, fakeredis nor
litellm; a tool that does reach the run's memory opens the robot's own memory then, writing
as the robot. CLI commands whose robots run on the scripted model never load litellm, nor
does a provider call refused for a missing key. Figures: bench/startup.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.redis_server import REPO_ROOT

FIRST_RUN = r"""
import json, sys
from robot_lab.runtime.robot import build
from robot_lab.runtime.tools import tool

@tool
def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

@tool
def remember(note: str) -> str:
    '''Keep a note in the run's memory.'''
    from robot_lab.runtime.robot.context import current_memory
    current_memory().set("note", note)
    return "kept"

robot = build("first", model="scripted/echo", local_tools=[add, remember] if sys.argv[1] == "memory" else [add])
result = robot.run("hello", tools="inherit")
loaded = sorted({name.split(".")[0] for name in sys.modules})
out = {"reply": result.reply, "loaded": loaded}
if sys.argv[1] == "memory":
    change = robot.memory.changes(since_version=0)[-1]
    out["note"] = robot.memory.get("note")
    out["writer"] = change.writer
print("OUT=" + json.dumps(out), flush=True)
"""


def _first_run(mode: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ROBOT_LAB_ALLOW_MODEL_REQUESTS": "0", "HOME": "/tmp"}
    done = subprocess.run([sys.executable, "-c", FIRST_RUN, mode], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUT=")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("OUT="))


def test_a_first_run_with_a_tool_call_and_no_memory_loads_no_redis_client() -> None:
    out = _first_run("plain")
    assert "Tool results:" in out["reply"] and "- add: 0" in out["reply"]
    assert not {"redis", "fakeredis", "litellm", "rq", "numpy"} & set(out["loaded"]), out["loaded"]


def test_a_tool_reaching_the_runs_memory_opens_the_robots_own_and_writes_as_the_robot() -> None:
    out = _first_run("memory")
    assert "- remember: kept" in out["reply"]
    assert out["note"] == "a" and out["writer"] == "first"
    assert "fakeredis" in out["loaded"]  # embedded mode: opened on first use


CLI_RUN = r"""
import sys
from robot_lab.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except BaseException as exc:  # a command's clear error (or exit) is what some of these test
    print(f"RAISED={type(exc).__name__}: {exc}", flush=True)
print("LITELLM=" + str("litellm" in sys.modules), flush=True)
"""


@pytest.mark.parametrize("args", [
    ["chat", "hi"],
    ["chat", "-m", "openai/gpt-4o-mini", "hello"],  # no key: refused before litellm loads
    ["demo", "--plain"],
    ["status"],
    ["runs"],
])
def test_cli_commands_on_the_scripted_model_never_load_litellm(args: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ROBOT_LAB_ALLOW_MODEL_REQUESTS": "1", "HOME": "/tmp", "ROBOT_LAB_DEMO_DELAY_MS": "0"}
    done = subprocess.run([sys.executable, "-c", CLI_RUN, *args], env=env, capture_output=True, text=True, timeout=120)
    assert "LITELLM=False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    if "openai/gpt-4o-mini" in args:
        assert "no credentials: set OPENAI_API_KEY" in done.stdout + done.stderr
