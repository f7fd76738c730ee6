"""`robot-lab demo` and `robot-lab run` in embedded mode (no REDIS_URL): the whole support-desk
network runs in this process on fakeredis with in-process rq workers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from robot_lab import connection
from robot_lab.cli import main


@pytest.fixture(autouse=True)
def _fresh_embedded(monkeypatch):
    monkeypatch.setattr(connection, "_embedded_server", None)
    monkeypatch.setattr(connection, "_clients", {})
    monkeypatch.setenv("ROBOT_LAB_LOG_LEVEL", "WARNING")
    from robot_lab import demo

    demo.register_scripts(0)
    yield
    demo.register_scripts()


def test_demo_routes_analyses_in_parallel_and_summarizes():
    result = CliRunner().invoke(main, ["demo", "--plain", "--delay-ms", "0", "-m", "The app crashes on login"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "embedded mode" in out
    assert "routed to: technical" in out
    assert "task.skipped billing" in out and "task.skipped general" in out
    assert "'sentiment': 'sentiment: frustrated'" in out and "'urgency': 'urgency: high'" in out
    assert "final answer (summarize)" in out and "Technical: the login crash" in out


def test_run_command_embedded_json():
    result = CliRunner().invoke(main, ["run", "robot_lab.demo:support", "Do you have an office in Lisbon?", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["status"] == "completed" and data["final_task"] == "summarize"
    assert data["states"]["general"] == "done" and data["states"]["billing"] == "skipped"
    assert data["reply"].startswith("Summary for the support log:\n## general\nGeneral:")
    assert "sentiment: neutral" in data["reply"]


@pytest.mark.parametrize(
    "target, message",
    [
        ("robot_lab.demo:nope", "app 'support-desk' has no network 'nope' (networks: support)"),
        ("no_such_pkg.mod:net", "cannot import 'no_such_pkg.mod'"),
        ("justaname", "must look like 'package.module:network'"),
    ],
)
def test_run_command_bad_targets(target, message):
    result = CliRunner().invoke(main, ["run", target, "hi"])
    assert result.exit_code != 0
    assert message in result.output


def test_worker_command_refuses_embedded_mode_and_unknown_robots(monkeypatch, real_redis_url, key_prefix):
    result = CliRunner().invoke(main, ["worker", "billing"])
    assert result.exit_code != 0 and "needs a Redis server: set REDIS_URL" in result.output
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    from robot_lab import settings

    monkeypatch.setattr(settings, "_settings", None)
    result = CliRunner().invoke(main, ["worker", "ghost-robot-xyz"])
    assert result.exit_code != 0
    assert "unknown robot 'ghost-robot-xyz'" in result.output


def test_demo_of_an_all_scripted_network_never_imports_litellm(tmp_path):
    """The README's first command warms up only the models its network uses (as `robot-lab
    worker` does): scripted robots need no litellm (seconds and ~200 MB). Timing:
    bench/demo.py."""
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom robot_lab.cli import main\n"
            "try:\n    main(['demo', '--plain', '--delay-ms', '0'], standalone_mode=False)\n"
            "finally:\n    print('LITELLM=' + str('litellm' in sys.modules), flush=True)\n")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["ROBOT_LAB_LOG_LEVEL"] = "WARNING"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "final answer (summarize)" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "LITELLM=False"


def test_demo_warms_up_litellm_when_a_robot_uses_a_provider_model():
    from robot_lab.commands.demo import network_models
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    net = create_network("mixed")
    net.task("a", build("scripted-one", model="scripted/echo"))
    net.task("b", build("provider-one", model="openai/gpt-4o-mini"), depends_on="a")
    assert network_models(net) == ["scripted/echo", "openai/gpt-4o-mini"]
