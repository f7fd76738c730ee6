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
