"""Builds with real ``robot-lab worker`` processes on a real Redis: a run pinned to the build
it started on is served only by workers of that build; while none is alive it is stalled,
not failed, and a worker of that build brought back completes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.run_state import RunStore
from tests.redis_server import REPO_ROOT, wait_for
from tests.stopping import stopped
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

pytestmark = pytest.mark.slow

# Two builds of one app: build B's tool gained an optional parameter, nothing else changed.
APP_MODULE = '''
from robot_lab.app import App
from robot_lab.runtime.robot import build


def lookup(city: str{extra}) -> str:
    """Look a city up."""
    return city


app = App("rollout")
clerk = app.add_robot(build({robot!r}, model="scripted/sleep:300", local_tools=[lookup]))
chain = app.network("chain")
chain.task("first", clerk)
chain.task("second", clerk, depends_on="first")
'''


def _write_app(directory: Path, module: str, robot: str, extra: str) -> Path:
    directory.mkdir()
    (directory / f"{module}.py").write_text(APP_MODULE.format(robot=robot, extra=extra))
    return directory


def _cli(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([str(VENV_BIN / "robot-lab"), *args], env=env, cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode in (0, 3), out.stderr
    return out.stdout


def _builds(env: dict[str, str]) -> dict[str, dict]:
    return {row["build"]: row for row in json.loads(_cli(env, "status", "--builds", "--json"))["builds"]}


def _starts(store: RunStore) -> list[tuple[str, int]]:
    """(task, pid of the worker process) of each start of a task of the run."""
    return [(e.task, int(e.data["worker"].split(":")[0].rsplit(".", 1)[1]))
            for _, e in store.events() if e.event == "task.started"]


# three worker starts, a stop and sweeps a lease apart: minutes on a loaded machine, each wait bounded itself
@pytest.mark.timeout(600)
def test_pinned_runs_stall_on_their_build_and_resume_when_it_returns(  # noqa: F811
        real_client, real_redis_url, key_prefix, processes, tmp_path, monkeypatch):
    client = real_client
    module, robot = f"rollout_{uid()}", f"clerk-{uid()}"
    app_path = f"{module}:app"
    dir_a = _write_app(tmp_path / "build_a", module, robot, "")
    dir_b = _write_app(tmp_path / "build_b", module, robot, ', units: str = "metric"')

    def env(directory: Path) -> dict[str, str]:
        return child_env(real_redis_url, key_prefix, PYTHONPATH=f"{directory}{os.pathsep}{REPO_ROOT}")

    env_a, env_b = env(dir_a), env(dir_b)
    build_a = _cli(env_a, "worker", "--app", app_path, "--build").strip()
    build_b = _cli(env_b, "worker", "--app", app_path, "--build").strip()
    assert build_a.startswith("b-") and build_b.startswith("b-") and build_a != build_b

    # this process submits as build A (it imports the app from build A's folder)
    monkeypatch.syspath_prepend(str(dir_a))
    from robot_lab.app import load_app

    network = load_app(app_path).get_network("chain")
    coordinator = Coordinator(connection=client)
    keys = Keys(prefix=key_prefix)
    worker = [str(VENV_BIN / "robot-lab"), "worker", robot, "--no-bus", "--app", app_path]

    first_a = processes.start(worker, env_a, "worker-a1")
    warm = coordinator.submit(network, "warm up")
    assert warm.store.meta()["build"] == build_a
    wait_for(lambda: warm.store.status() == "completed", timeout=120, interval=0.2)
    first_a.send_signal(signal.SIGTERM)
    assert stopped(first_a) == 0

    runs = [coordinator.submit(network, f"run {i}") for i in range(3)]
    loose = coordinator.submit(network, "not pinned", pinned=False)  # any build may serve it
    assert {run.store.meta()["pinned"] for run in runs} == {"1"} and loose.store.meta()["pinned"] == "0"
    worker_b = processes.start(worker, env_b, "worker-b")
    # B serves the run that is not pinned (so it is up and taking jobs) and hands the pinned ones back
    wait_for(lambda: loose.store.status() == "completed", timeout=120, interval=0.2)
    handed = lambda: {m.decode().split("\t")[1] for m in client.zrange(keys.builds_handed(), 0, -1)}  # noqa: E731
    wait_for(lambda: handed() == {run.run_id for run in runs}, timeout=120, interval=0.2)
    assert all(run.store.status() == "running" for run in runs)
    assert all(run.store.states() == {"first": "queued", "second": "pending"} for run in runs)
    assert all(run.store.attempts().get("first", 0) <= 1 for run in runs)  # no attempt counted by B

    wait_for(lambda: build_b in _builds(env_b), timeout=60, interval=0.5)  # B's first healthy beat
    status = json.loads(_cli(env_b, "status", "--json"))
    assert any(f"3 run(s) stalled on build {build_a}" in line for line in status["problems"]), status["problems"]
    builds = _builds(env_b)
    assert builds[build_a]["stalled"] and sorted(builds[build_a]["runs"]) == sorted(r.run_id for r in runs)
    assert builds[build_a]["workers"] == [] and builds[build_b]["drained"] and builds[build_b]["workers"]

    second_a = processes.start(worker, env_a, "worker-a2")
    for run in runs:
        wait_for(lambda run=run: run.store.status() == "completed", timeout=120, interval=0.2)
        assert _starts(run.store) == [("first", second_a.pid), ("second", second_a.pid)]  # never on B, once each
        assert run.store.attempts() == {"first": 1, "second": 1}
    assert _starts(loose.store) == [("first", worker_b.pid), ("second", worker_b.pid)]
    builds = _builds(env_b)
    assert builds[build_a]["drained"] and builds[build_a]["runs"] == [] and not builds[build_a]["stalled"]
    assert not any("stalled on build" in line for line in json.loads(_cli(env_b, "status", "--json"))["problems"])
