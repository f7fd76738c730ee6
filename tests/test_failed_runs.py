"""A run whose tasks failed says so everywhere an operator looks: its status
(``completed_with_errors``), the exit status of ``robot-lab run`` (3), ``runs --status``,
the ``status`` problem line, the ``robot_lab_runs_recent`` gauge -- while the run itself
still goes on past the failing robot (robot_lab's rule)."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from robot_lab import connection
from robot_lab.cli import main
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.embedded import EmbeddedWorkers
from robot_lab.workers.fleet_status import collect_status, recent_runs
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

TARGET = "tests.fixtures.failing_network:network"


@pytest.fixture(autouse=True)
def _no_retries(monkeypatch):
    monkeypatch.setenv("ROBOT_LAB_MAX_RETRIES", "0")


def _failing_run(redis_client, key_prefix):
    """The fixture's network with robots of this test's own (their rq queues are not prefixed)."""
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    keys = Keys(prefix=key_prefix)
    bad, after, never = (build(f"{kind}-{uid()}", model=model) for kind, model in (
        ("bad", "scripted/fail:provider down"), ("after", "scripted/echo"), ("never", "scripted/echo")))
    network = create_network("half-broken")
    network.task("bad", bad, retries=0, routes=["never"])
    network.task("after", after, depends_on=["bad"])
    network.task("never", never, depends_on="optional")
    with EmbeddedWorkers(redis_client, [bad.name, after.name, never.name], threads=2):
        handle = Coordinator(connection=redis_client, keys=keys).submit(network, "x")
        return handle.wait(timeout=60), keys


def test_status_runs_and_gauge_name_the_run_with_failed_tasks(redis_client, key_prefix):
    result, keys = _failing_run(redis_client, key_prefix)
    assert result.status == "completed_with_errors"
    assert result.states == {"bad": "failed", "after": "done", "never": "skipped"}  # the run went on

    [row] = recent_runs(redis_client, keys, status="completed_with_errors")
    assert row["run_id"] == result.run_id and (row["done"], row["failed"], row["skipped"]) == (1, 1, 1)
    assert recent_runs(redis_client, keys, status="completed") == []

    problems = collect_status(redis_client, keys)["problems"]
    assert [p for p in problems if "failed tasks" in p] == [
        f"1 run(s) with failed tasks in the last hour ({result.run_id}; `robot-lab runs --status "
        "completed_with_errors`, `robot-lab watch <run>` for their errors)"]

    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from robot_lab.workers.fleet_gauges import RedisCollector

    registry = CollectorRegistry()
    registry.register(RedisCollector(redis_client, keys))
    text = generate_latest(registry).decode()
    assert 'robot_lab_runs_recent{status="completed_with_errors"} 1.0' in text
    assert 'robot_lab_runs_recent{status="completed"} 0.0' in text


@pytest.fixture
def _fresh_embedded(monkeypatch):
    monkeypatch.setattr(connection, "_embedded_server", None)
    monkeypatch.setattr(connection, "_clients", {})
    monkeypatch.delenv("REDIS_URL", raising=False)


def test_run_embedded_exits_3_and_names_the_failed_task(_fresh_embedded, monkeypatch):
    monkeypatch.setenv("FAILING_NETWORK_SUFFIX", "")
    out = CliRunner().invoke(main, ["run", TARGET, "x", "--json"])
    assert out.exit_code == 3, out.output
    data = json.loads(next(line for line in out.stdout.splitlines() if line.startswith('{"run_id"')))
    assert data["status"] == "completed_with_errors" and data["states"]["bad"] == "failed"
    assert f"Error: run {data['run_id']}: 1 task(s) failed: bad (Error: InferenceError:" in out.output
    listed = CliRunner().invoke(main, ["runs", "--status", "completed_with_errors", "--json"])
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [data["run_id"]]


@pytest.mark.slow
def test_run_with_a_real_worker_exits_3(real_client, real_redis_url, key_prefix, processes):  # noqa: F811
    """The shipped submit Job runs `robot-lab run`: its exit status is what Kubernetes reads."""
    from robot_lab.runtime.registry import publish_specs

    suffix = f"-{uid()}"
    env = child_env(real_redis_url, key_prefix, FAILING_NETWORK_SUFFIX=suffix)
    robots = [f"fr-bad{suffix}", f"fr-after{suffix}", f"fr-never{suffix}"]
    from robot_lab.runtime.robot import build

    publish_specs([build(robots[0], model="scripted/fail:provider down").to_spec(),
                   build(robots[1], model="scripted/echo").to_spec(),
                   build(robots[2], model="scripted/echo").to_spec()], connection=real_client,
                  keys=Keys(prefix=key_prefix))
    processes.start([str(VENV_BIN / "robot-lab"), "worker", *robots], env, "worker")
    done = subprocess.run([str(VENV_BIN / "robot-lab"), "run", TARGET, "x", "--timeout", "90"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr + processes.logs()
    assert "completed_with_errors" in done.stdout and "1 task(s) failed: bad" in done.stderr


def test_a_failed_task_runs_again_and_the_run_finishes_anew(redis_client, key_prefix):
    from robot_lab.network.dsl import create_network
    from robot_lab.llm.scripted import register_script
    from robot_lab.runtime.robot import build

    script = f"flaky-{uid()}"
    register_script(script, {"default": {"error": "provider down"}})
    keys = Keys(prefix=key_prefix)
    flaky, after = build(f"flaky-{uid()}", model=f"scripted/{script}"), build(f"after-{uid()}", model="scripted/echo")
    net = create_network("rerun")
    net.task("flaky", flaky, retries=0)
    net.task("after", after, depends_on=["flaky"])
    coordinator = Coordinator(connection=redis_client, keys=keys)
    with EmbeddedWorkers(redis_client, [flaky.name, after.name], threads=2):
        handle = coordinator.submit(net, "x")
        first = handle.wait(timeout=60)
        assert first.status == "completed_with_errors" and first["after"].reply.startswith("echo: Error:")
        assert coordinator.rerun(handle.run_id, "after") == "not-failed"
        register_script(script, {"default": {"reply": "fixed"}})  # the provider is back
        assert coordinator.rerun(handle.run_id, "flaky") == "ok"
        again = handle.wait(timeout=60)  # reads past the first stream.ended
    assert again.status == "completed" and again.states == {"flaky": "done", "after": "done"}
    assert again.reply == "echo: fixed"  # the task after it ran again, on the new result
    assert handle.store.attempts()["flaky"] == 2
    [rerun] = [e for e in handle.events() if e.event == "task.rerun"]
    assert rerun.task == "flaky" and rerun.data == {"reset": ["flaky", "after"]}
    assert [e.data["status"] for e in handle.events() if e.event == "run.completed"] == [
        "completed_with_errors", "completed"]
    assert coordinator.rerun(handle.run_id, "flaky") == "not-failed"
    replayed = [e.event for e in handle.follow(sweep=False)]  # a late follower reads both finishes
    assert replayed.count("stream.ended") == 2 and replayed[-1] == "stream.ended" and "task.rerun" in replayed
