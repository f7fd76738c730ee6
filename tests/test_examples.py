"""Every example runs offline (scripted model, embedded Redis) and prints what it promises.

All examples run in one child interpreter, one after another with ``runpy``, so litellm's
multi-second import is paid once; each example's output and failure are kept apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).parent.parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("[0-9][0-9]_*.py"))
EXPECTED = {
    "01_simple_robot.py": "echo: What is a message bus",
    "02_tools.py": "stopped: Circuit breaker triggered",
    "03_streaming.py": "streams arrive word by word",
    "04_templates.py": "support agent of Acme",
    "05_routing_network.py": "'The app crashes at login' -> routed to ['tech']",
    "06_mcp.py": "MCP tool multiply({'a': 5, 'b': 7}) -> 35",
    "07_network_memory.py": "tickets handled: 3 -- subscriber saw [1, 2, 3]",
    "08_message_bus.py": "dead letter: reason=invalid",
    "09_skills.py": "no skill for small talk in a new conversation: True",
    "10_budgets.py": "circuit breaker: Circuit breaker triggered: 5 tool calls exceeded max_tool_rounds (4)",
    "11_delegation.py": "timeout: Delegation to 'nobody11' timed out after 0.5s",
    "12_hooks.py": "'delete_account': 'refused by policy'",
    "13_multiprocess.py": "'Do you have an office in Lisbon?': routed to ['general'], completed",
    "14_refund_approval.py": "payments made: ['B-2002:42']; answered by ['alice', 'bob']",
}

RUNNER = r"""
import contextlib, io, json, runpy, sys, traceback
results = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        results[path] = {"ok": True, "stdout": out.getvalue()}
    except BaseException:
        results[path] = {"ok": False, "stdout": out.getvalue(), "error": traceback.format_exc()}
print("@@RESULTS@@" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def example_runs() -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "REDIS_URL"}
    env["ROBOT_LAB_ALLOW_MODEL_REQUESTS"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *map(str, EXAMPLES)],
        capture_output=True, text=True, env=env, timeout=300, cwd=EXAMPLES_DIR.parent,
    )
    marker = done.stdout.rfind("@@RESULTS@@")
    assert marker >= 0, done.stderr[-3000:]
    return json.loads(done.stdout[marker + len("@@RESULTS@@"):])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_offline(path: Path, example_runs: dict[str, dict]) -> None:
    run = example_runs[str(path)]
    assert run["ok"], run.get("error")
    if path.name in EXPECTED:
        assert EXPECTED[path.name] in run["stdout"]
