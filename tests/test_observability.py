"""The observability hooks in one process: off unless configured (and then they import
nothing), the standard OTEL_* variables turn tracing on, a missing extra is a warning and not
a crash; the bus counters count what happened to each message; the dashboard's routes keep
actions behind the flag and the token and stream a run's events over SSE."""

from __future__ import annotations

import json
import subprocess
import sys

import fakeredis
import pytest

from robot_lab.bus import Bus, BusPoller
from robot_lab.keys import Keys
from robot_lab.observability import metrics
from tests.redis_server import REPO_ROOT

BUS_ROUND = """
import sys, fakeredis
from robot_lab.bus import Bus, BusPoller
from robot_lab.observability import otel
bus = Bus(redis=fakeredis.FakeRedis())
poller = BusPoller("obs", bus, block_ms=0)
poller.on_message(lambda m: None)
bus.publish("obs", "hello", create=True)
assert poller.poll(max_messages=1, block_ms=0) == 1
print("TRACING", otel.tracer() is not None, "PROMETHEUS", "prometheus_client" in sys.modules)
"""


def run_child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "ROBOT_LAB_LOG_FORMAT": "json"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=base | env, cwd=REPO_ROOT)


def test_unconfigured_tracing_and_metrics_are_off_and_import_nothing() -> None:
    out = run_child(BUS_ROUND)
    assert out.returncode == 0, out.stderr
    assert "TRACING False PROMETHEUS False" in out.stdout


def test_otel_traces_exporter_console_turns_tracing_on_from_the_environment() -> None:
    out = run_child(BUS_ROUND, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="obs-test")
    assert out.returncode == 0, out.stderr
    assert "TRACING True" in out.stdout
    spans = out.stdout  # the console exporter prints each span as JSON at exit
    assert '"name": "bus.publish"' in spans and '"name": "bus.handle"' in spans
    assert '"service.name": "obs-test"' in spans


def test_otel_sdk_disabled_wins_and_a_missing_extra_is_a_warning() -> None:
    out = run_child(BUS_ROUND, OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true")
    assert "TRACING False" in out.stdout, out.stderr
    blocked = "import sys\nsys.modules['opentelemetry'] = None\n" + BUS_ROUND  # as if not installed
    out = run_child(blocked, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert out.returncode == 0, out.stderr
    assert "TRACING False" in out.stdout
    assert "otel.not_installed" in out.stderr and "robot-lab[otel]" in out.stderr


def sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_bus_counters_follow_each_message_to_ack_retry_or_dead_letter() -> None:
    pytest.importorskip("prometheus_client")
    assert metrics.enable()
    robot = f"counted-{id(object())}"
    bus = Bus(redis=fakeredis.FakeRedis(), keys=Keys(prefix="obs"))
    poller = BusPoller(robot, bus, block_ms=0, max_deliveries=2, retry_delay=0)

    def handler(message):  # type: ignore[no-untyped-def]
        if message.content == "bad":
            raise RuntimeError("boom")

    poller.on_message(handler)
    bus.publish(robot, "good", create=True)
    bus.publish(robot, "bad")
    for _ in range(10):
        poller.poll(max_messages=10, block_ms=0)
    assert sample("robot_lab_messages_handled_total", robot=robot) == 1
    assert sample("robot_lab_messages_failed_total", robot=robot) == 2  # two deliveries, both raised
    assert sample("robot_lab_messages_dead_lettered_total", robot=robot, reason="failed") == 1
    assert sample("robot_lab_handler_seconds_count", robot=robot) == 3
    assert sample("robot_lab_messages_in_flight", robot=robot) == 0
    assert bus.dlq_size(robot) == 1


# --- the dashboard's routes ----------------------------------------------------------------

@pytest.fixture
def finished_run():
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    connection = fakeredis.FakeRedis()
    net = create_network("routes")
    robot = build("router-bot", model="scripted/echo")
    net.task("first", robot, memory_key="first")
    net.task("second", robot, depends_on="first")
    result = net.run("hi", connection=connection)
    return connection, result.run_id


def client(connection, token=None):  # type: ignore[no-untyped-def]
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from robot_lab.dashboard.server import create_app
    from robot_lab.keys import default_keys

    return TestClient(create_app(connection, default_keys(), token=token))


def test_actions_answer_403_read_only_and_401_without_the_token(finished_run) -> None:
    connection, run_id = finished_run
    read_only = client(connection)
    assert read_only.get("/api/config").json()["actions"] is False
    assert read_only.post(f"/api/runs/{run_id}/cancel").status_code == 403
    acting = client(connection, token="t0ken")
    assert acting.post(f"/api/runs/{run_id}/cancel").status_code == 401
    assert acting.post(f"/api/runs/{run_id}/cancel", headers={"Authorization": "Bearer nope"}).status_code == 401
    done = acting.post(f"/api/runs/{run_id}/cancel", headers={"Authorization": "Bearer t0ken"})
    assert done.status_code == 200 and done.json()["status"] == "completed"  # a finished run stays finished
    bad = acting.post("/api/dlq/router-bot/replay", headers={"Authorization": "Bearer t0ken"},
                      json={"ids": "not-a-list"})
    assert bad.status_code == 400


def test_run_detail_and_its_event_stream(finished_run) -> None:
    connection, run_id = finished_run
    app = client(connection)
    detail = app.get(f"/api/runs/{run_id}").json()
    assert [t["name"] for t in detail["tasks"]] == ["first", "second"]
    assert detail["tasks"][1]["deps"] == ["first"] and detail["status"] == "completed"
    assert app.get("/api/runs/nope").status_code == 404
    with app.stream("GET", f"/api/runs/{run_id}/stream") as response:
        body = "".join(response.iter_text())
    kinds = [line.split(": ", 1)[1] for line in body.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "snapshot" and kinds[-2:] == ["snapshot", "end"]
    events = [json.loads(line[6:]) for line, prev in zip(body.splitlines()[1:], body.splitlines())
              if prev == "event: run"]
    assert [e["event"] for e in events if e["event"].startswith("run.")] == ["run.started", "run.completed"]
    assert "event: memory" in body  # the memory_key write
    overview = app.get("/api/overview").json()
    assert any(r["run_id"] == run_id for r in overview["recent"])


# --- spans inside one robot run ------------------------------------------------------------

@pytest.fixture
def spans(memory_spans):  # the shared in-memory exporter (tests/conftest.py)
    return memory_spans


def test_a_robot_run_nests_llm_tool_and_mcp_call_spans(spans) -> None:
    import robot_lab

    server = str(REPO_ROOT / "tests" / "mcp_servers" / "calculator.py")

    def lookup(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    robot = robot_lab.build(name="spanner", model="scripted/echo", local_tools=[lookup],
                            mcp_servers=[{"name": "calc", "transport": "stdio", "command": sys.executable,
                                          "args": [server], "timeout": 30}])
    try:
        robot.run("where is it", mcp="inherit", tools=["lookup", "add"])
    finally:
        robot.disconnect()
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    parent = {s.name + ":" + str(s.attributes.get("robot_lab.tool", "")): by_id[s.parent.span_id].name
              for s in finished if s.parent is not None and s.parent.span_id in by_id}
    assert parent["tool.call:lookup"] == "robot.run"
    assert parent["tool.call:add"] == "robot.run"
    assert parent["mcp.call:add"] == "tool.call"  # the MCP request inside the tool call
    assert parent["llm.call:"] == "robot.run"
    run = next(s for s in finished if s.name == "robot.run")
    assert run.attributes["robot_lab.robot"] == "spanner" and run.attributes["robot_lab.output_tokens"] > 0
    assert len({s.context.trace_id for s in finished}) == 1


def test_a_running_run_can_be_cancelled_with_the_token() -> None:
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    connection = fakeredis.FakeRedis()
    net = create_network("stuck")
    net.task("never", build("nobody-serves", model="scripted/echo"))
    handle = Coordinator(connection=connection).submit(net, "no worker")  # no worker: stays running
    app = client(connection, token="t0ken")
    assert app.get(f"/api/runs/{handle.run_id}").json()["status"] == "running"
    done = app.post(f"/api/runs/{handle.run_id}/cancel", headers={"Authorization": "Bearer t0ken"})
    assert done.status_code == 200 and done.json()["status"] == "cancelled"
    assert app.get(f"/api/runs/{handle.run_id}").json()["status"] == "cancelled"


def test_a_skill_script_call_is_a_span(spans, tmp_path) -> None:
    from robot_lab.skills.script_tool import ScriptTool

    script = tmp_path / "hello.py"
    script.write_text("print('hello from the script')\n")
    tool = ScriptTool.from_path(script, skill_dir=tmp_path, skill_name="greeter")
    assert tool is not None
    output = tool.call({"args": []})
    span = next(s for s in spans.get_finished_spans() if s.name == "skill.script")
    assert span.attributes["robot_lab.skill"] == "greeter" and span.attributes["robot_lab.tool"] == tool.name
    assert "hello from the script" in output


def test_otel_exporter_otlp_endpoint_sends_spans_over_otlp_http(tmp_path) -> None:
    """The real OTLP/HTTP exporter, configured only by OTEL_EXPORTER_OTLP_ENDPOINT, posts the
    spans to a collector (here a local HTTP server that records the requests)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    import http.server
    import threading

    received: list[tuple[str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = run_child(BUS_ROUND, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
                        OTEL_SERVICE_NAME="otlp-test")
    finally:
        server.shutdown()
        thread.join(5)
    assert out.returncode == 0, out.stderr
    assert "TRACING True" in out.stdout
    paths = {path for path, _ in received}
    body = b"".join(data for _, data in received)
    assert paths == {"/v1/traces"}
    assert b"bus.publish" in body and b"bus.handle" in body and b"otlp-test" in body


def test_a_worker_warm_up_sends_no_trace(spans) -> None:
    from robot_lab.llm.gateway import LLMGateway
    from robot_lab.workers.process import warm_up

    warm_up(["scripted/echo"])
    assert spans.get_finished_spans() == ()  # no one-span trace per worker start
    LLMGateway(max_retries=0).complete("scripted/text:ok", [{"role": "user", "content": "a request"}])
    assert [s.name for s in spans.get_finished_spans()] == ["llm.call"]  # a real call still is one


def test_robot_lab_run_roots_its_trace_at_network_run(spans, real_client, monkeypatch, tmp_path) -> None:
    """With REDIS_URL, `robot-lab run` submits and waits: its trace starts at network.run, as
    the tree in docs/observability.md shows (and as Network.run's does)."""
    import uuid

    from click.testing import CliRunner

    from robot_lab import settings
    from robot_lab.cli import main
    from robot_lab.network.embedded import EmbeddedWorkers

    monkeypatch.setattr(settings, "_settings", None)
    robot = f"traced-{uuid.uuid4().hex[:8]}"  # its own rq queue on the shared server
    module = f"traced_net_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from robot_lab.network.dsl import create_network\nfrom robot_lab.runtime.robot import build\n"
        f"network = create_network('half-broken')\nnetwork.task('only', build({robot!r}, model='scripted/echo'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with EmbeddedWorkers(real_client, [robot], threads=1):
        out = CliRunner().invoke(main, ["run", f"{module}:network", "x"])
    assert out.exit_code == 0, out.output
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    [root] = [s for s in finished if s.parent is None or s.parent.span_id not in by_id]
    assert root.name == "network.run" and root.attributes["robot_lab.network"] == "half-broken"
    submit = next(s for s in finished if s.name == "network.submit")
    assert by_id[submit.parent.span_id].name == "network.run"
    assert {by_id[s.parent.span_id].name for s in finished if s.name == "task"} == {"network.submit"}


def test_a_parked_run_is_listed_and_answered_from_the_dashboard_with_the_token() -> None:
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.network.embedded import EmbeddedWorkers
    from robot_lab.llm.scripted import register_script
    from robot_lab.runtime.robot import build

    connection = fakeredis.FakeRedis()
    register_script("dash-ask", {"turns": [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?"}}]}, {"reply": "{tool_results}"}]})
    bot = build("dash-asker", model="scripted/dash-ask", local_tools=["robot_lab.runtime.durable.human:AskUser"])
    net = create_network("dash")
    net.task("ask", bot, tools="inherit")
    with EmbeddedWorkers(connection, [bot.name], threads=1):
        handle = Coordinator(connection=connection).submit(net, "refund")
        app = client(connection, token="t0ken")
        import time

        for _ in range(200):
            listed = app.get("/api/pending").json()
            if listed:
                break
            time.sleep(0.02)
        [request] = listed
        assert request["question"] == "Which order?" and request["owner"]["run_id"] == handle.run_id
        assert app.post(f"/api/answer/{request['id']}", json={"text": "A1"}).status_code == 401  # no token
        assert client(connection).post(f"/api/answer/{request['id']}", json={"text": "A1"}).status_code == 403
        bad = app.post(f"/api/answer/{request['id']}", json={"approve": "yes"}, headers={"Authorization": "Bearer t0ken"})
        assert bad.status_code == 400
        done = app.post(f"/api/answer/{request['id']}", json={"text": "A1", "by": "eve"},
                        headers={"Authorization": "Bearer t0ken"})
        assert done.status_code == 200 and done.json()["answer"]["by"] == "eve"
        again = app.post(f"/api/answer/{request['id']}", json={"text": "B2"}, headers={"Authorization": "Bearer t0ken"})
        assert again.status_code == 400 and "already answered by eve" in again.json()["error"]
        assert handle.wait(timeout=30).reply == "- ask_user: A1"
