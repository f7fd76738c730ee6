"""Build ids and pinned runs, in-process (fakeredis and a real Redis): what a build hashes, a
pinned run handed back by a worker of another build, resumed once its build beats again, and
runs recorded before builds existed."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from click.testing import CliRunner
from rq.job import Job

from robot_lab.app import App
from robot_lab.cli import main
from robot_lab.keys import default_keys
from robot_lab.network import builds
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.embedded import EmbeddedWorkers
from robot_lab.network.serializer import JobSerializer
from robot_lab.runtime.robot import build
from robot_lab.settings import reload_settings
from tests.redis_server import wait_for


def lookup(city: str) -> str:
    """Look a city up."""
    return city


def lookup_with_units(city: str, units: str = "metric") -> str:
    """Look a city up."""
    return city


def _app(tool) -> App:
    app = App("rollout")
    app.add_robot(build("clerk", model="scripted/echo", local_tools=[tool]))
    return app


def _serve_build(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("ROBOT_LAB_BUILD", name)
    reload_settings()


def _beat(client, build_name: str) -> None:
    """A live worker heartbeat of ``build_name`` (as workers/health.py writes it)."""
    keys = default_keys()
    name = f"fake-worker-{build_name}"
    client.set(keys.worker(name), json.dumps({"name": name, "build": build_name}), px=60_000)
    client.zadd(keys.workers(), {name: time.time()})


def test_a_changed_tool_signature_is_a_new_build(monkeypatch):
    assert builds.compute_build(_app(lookup)) == builds.compute_build(_app(lookup))
    assert builds.compute_build(_app(lookup)) != builds.compute_build(_app(lookup_with_units))
    assert builds.compute_build(None) != builds.compute_build(_app(lookup))  # no app: the version alone
    _serve_build(monkeypatch, "release-7")
    assert builds.build_for_app("no.such:app") == "release-7"  # the setting wins, nothing imported


def _network():
    net = create_network(f"pinned-{uuid.uuid4().hex[:6]}")
    net.task("only", build(f"clerk-{uuid.uuid4().hex[:8]}", model="scripted/echo"))
    return net


def test_a_pinned_run_waits_for_its_build_and_is_never_run_by_another(redis_client, monkeypatch):
    keys = default_keys()
    net = _network()
    _serve_build(monkeypatch, "build-a")
    handle = Coordinator(connection=redis_client).submit(net, "hello", pinned=True)
    assert handle.store.meta()["build"] == "build-a"
    job = Job.fetch(handle.store.job_id("only"), connection=redis_client, serializer=JobSerializer)
    assert job.meta["robot_lab_build"] == "build-a" and "build build-a" in job.description

    _serve_build(monkeypatch, "build-b")  # this process now serves another build
    robot = net.spec.tasks[0].robot
    with EmbeddedWorkers(redis_client, [robot], threads=1):
        wait_for(lambda: redis_client.zcard(keys.builds_handed()) == 1, timeout=60, interval=0.1)
        assert handle.store.states() == {"only": "queued"} and handle.store.status() == "running"
        assert handle.store.attempts() == {"only": 1}
        assert not [e for e in handle.events() if e.event == "task.started"]
        report = builds.build_report(redis_client, keys)
        assert report["build-a"]["stalled"] and report["build-a"]["runs"] == [handle.run_id]
        assert builds.stalled_problems(redis_client, keys) == [
            f"1 run(s) stalled on build build-a: no live worker of that build (start one to resume them): "
            f"{handle.run_id}"]
        out = CliRunner().invoke(main, ["status", "--builds", "--json"])
        assert json.loads(out.output)["builds"][0]["stalled"] is True
        assert CliRunner().invoke(main, ["status", "--builds", "--check"]).exit_code == 3
        monkeypatch.setattr(builds, "REQUEUE_AFTER", 0.0)
        assert builds.requeue_handed_back(redis_client, keys) == 0  # still no worker of build-a

        _serve_build(monkeypatch, "build-a")  # a worker of build-a is back
        _beat(redis_client, "build-a")
        assert builds.requeue_handed_back(redis_client, keys) == 1
        result = handle.wait(timeout=60)
    assert result.status == "completed" and result.reply == "echo: hello"
    assert handle.store.attempts() == {"only": 1}  # handing back counted no attempt
    assert redis_client.zcard(keys.builds_handed()) == 0
    report = builds.build_report(redis_client, keys)
    assert report["build-a"]["drained"] and not report["build-a"]["stalled"]
    out = CliRunner().invoke(main, ["status", "--builds"])
    assert "build-a" in out.output and "drained" in out.output


def test_runs_not_pinned_or_recorded_before_builds_are_served_by_any_build(redis_client, monkeypatch):
    _serve_build(monkeypatch, "build-a")
    coordinator = Coordinator(connection=redis_client)
    net = _network()
    loose = coordinator.submit(net, "one", pinned=False)
    older = coordinator.submit(net, "two", pinned=True)
    redis_client.hdel(older.store.key, "build", "pinned")  # as a release before builds wrote it
    _serve_build(monkeypatch, "build-b")
    with EmbeddedWorkers(redis_client, [net.spec.tasks[0].robot], threads=1):
        assert loose.wait(timeout=60).status == "completed"
        assert older.wait(timeout=60).status == "completed"
    assert redis_client.zcard(default_keys().builds_handed()) == 0


def test_a_run_without_an_app_is_not_pinned_by_default(redis_client):
    handle = Coordinator(connection=redis_client).submit(_network(), "hi")
    assert handle.store.meta()["pinned"] == "0" and handle.store.meta()["build"].startswith("b-")


def test_worker_build_option_prints_or_rejects(monkeypatch):
    monkeypatch.delenv("ROBOT_LAB_BUILD", raising=False)
    out = CliRunner().invoke(main, ["worker", "--build"])
    assert out.exit_code == 0 and out.output.strip() == builds.compute_build(None)
    out = CliRunner().invoke(main, ["worker", "--build", "two words"])
    assert out.exit_code != 0 and "a build id has no whitespace" in out.output


def test_an_app_this_process_cannot_load_has_the_build_of_no_app(monkeypatch):
    monkeypatch.delenv("ROBOT_LAB_BUILD", raising=False)
    assert builds.build_for_app("no_such_module_here:app") == builds.compute_build(None)


def test_a_sweep_goes_on_when_the_handed_back_index_holds_another_type(redis_client, monkeypatch):
    _serve_build(monkeypatch, "build-a")
    net = _network()
    redis_client.set(default_keys().builds_handed(), "by hand")
    with EmbeddedWorkers(redis_client, [net.spec.tasks[0].robot], threads=1):
        handle = Coordinator(connection=redis_client).submit(net, "hi", pinned=True)
        assert builds.requeue_handed_back(redis_client, default_keys()) == 0
        assert handle.wait(timeout=60).status == "completed"  # its own build: never handed back


def test_a_run_parked_on_a_question_resumes_only_on_its_build(redis_client, monkeypatch):
    """The deploy this is for: a run parks on a question under build A, the workers now run
    build B, the question is answered. B leaves the task alone (stalled, not failed); once A
    is back the run completes, its journal replayed by the build that recorded it."""
    from robot_lab.llm.scripted import register_script
    from robot_lab.runtime.durable import AskUser

    script = f"ask-{uuid.uuid4().hex[:8]}"
    register_script(script, {"turns": [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?"}}]},
        {"reply": "refunding {tool_results}"}]})
    net = create_network(f"parked-{uuid.uuid4().hex[:6]}")
    desk = build(f"desk-{uuid.uuid4().hex[:8]}", model=f"scripted/{script}", local_tools=[AskUser])
    net.task("desk", desk, tools="inherit")
    keys = default_keys()
    monkeypatch.setattr(builds, "REQUEUE_AFTER", 0.0)
    _serve_build(monkeypatch, "build-a")
    with EmbeddedWorkers(redis_client, [desk.name], threads=1):
        handle = Coordinator(connection=redis_client).submit(net, "refund please", pinned=True)
        question = wait_for(lambda: handle.pending(), timeout=60)[0]
        _serve_build(monkeypatch, "build-b")  # the rollout replaced the workers
        handle.answer("A1", request_id=question.id)
        wait_for(lambda: redis_client.zcard(keys.builds_handed()) == 1, timeout=60, interval=0.1)
        assert handle.store.status() == "running"
        assert builds.build_report(redis_client, keys)["build-a"]["stalled"]
        _serve_build(monkeypatch, "build-a")  # a worker of build A is back
        _beat(redis_client, "build-a")
        assert builds.requeue_handed_back(redis_client, keys) == 1
        result = handle.wait(timeout=60)
    assert result.status == "completed" and result.reply == "refunding - ask_user: A1", result.reply
