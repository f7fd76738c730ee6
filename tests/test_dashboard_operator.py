"""What the dashboard tells an operator, through its HTTP API (Starlette's TestClient, on
fakeredis and on a real server): failed tasks across runs with their error, re-running one
behind the action token, routing edges and each task's input in a run's detail, and a Redis
outage answered with a 503 and one log line pair instead of a 500 and a traceback per poll.
The page itself is driven in a real browser in tests/test_dashboard_browser.py."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from robot_lab.dashboard.server import create_app  # noqa: E402
from robot_lab.keys import Keys  # noqa: E402
from robot_lab.network.coordinator import Coordinator  # noqa: E402
from robot_lab.network.dsl import create_network  # noqa: E402
from robot_lab.network.embedded import EmbeddedWorkers  # noqa: E402
from robot_lab.runtime.robot import build  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.worker_procs import uid  # noqa: E402

AUTH = {"Authorization": "Bearer t0ken"}


@pytest.fixture(autouse=True)
def _no_retries(monkeypatch):
    monkeypatch.setenv("ROBOT_LAB_MAX_RETRIES", "0")


def test_failed_tasks_are_listed_and_one_can_be_re_run_with_the_token(redis_client, key_prefix):
    keys = Keys(prefix=key_prefix)
    router = build(f"router-{uid()}", model="scripted/route:billing")
    bad = build(f"bad-{uid()}", model="scripted/fail:down")
    net = create_network("desk")
    net.task("classify", router, routes=["billing", "general"])
    net.task("billing", bad, depends_on="optional", retries=0)
    net.task("general", router, depends_on="optional")
    coordinator = Coordinator(connection=redis_client, keys=keys)
    app = TestClient(create_app(redis_client, keys, token="t0ken"))
    with EmbeddedWorkers(redis_client, [router.name, bad.name], threads=2):
        handle = coordinator.submit(net, "refund please")
        assert handle.wait(timeout=60).status == "completed_with_errors"

        overview = app.get("/api/overview").json()
        [failed] = overview["failed_tasks"]
        assert (failed["run_id"], failed["task"], failed["robot"], failed["attempt"]) == (handle.run_id, "billing",
                                                                                         bad.name, 1)
        assert failed["error"].startswith("Error: InferenceError:") and failed["run_status"] == "completed_with_errors"

        detail = app.get(f"/api/runs/{handle.run_id}").json()
        tasks = {t["name"]: t for t in detail["tasks"]}
        assert tasks["billing"]["activators"] == ["classify"] and tasks["billing"]["deps"] == []  # a routing edge
        assert tasks["billing"]["input"] == "refund please"  # what its robot received
        assert tasks["general"]["state"] == "skipped"
        assert tasks["classify"]["reply"] == handle.result().context["classify"].reply  # computed, not stored
        assert tasks["classify"]["reply"] == "routed to billing"

        rerun = f"/api/runs/{handle.run_id}/tasks/billing/rerun"
        assert TestClient(create_app(redis_client, keys)).post(rerun).status_code == 403  # read-only
        assert app.post(rerun).status_code == 401
        refused = app.post(f"/api/runs/{handle.run_id}/tasks/classify/rerun", headers=AUTH)
        assert refused.status_code == 400 and "not-failed" in refused.json()["error"]
        assert app.post(rerun, headers=AUTH).json() == {"status": "ok"}
        again = handle.wait(timeout=60)
    assert again.status == "completed_with_errors" and handle.store.attempts()["billing"] == 2


def test_redis_down_is_a_503_and_one_log_line_pair_per_outage():
    import redis
    from structlog.testing import capture_logs

    from redis.backoff import NoBackoff
    from redis.retry import Retry

    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    app = TestClient(create_app(down, Keys(prefix="rl-down")), raise_server_exceptions=False)
    with capture_logs() as logs:
        for _ in range(3):  # the page polls every 2 s
            answer = app.get("/api/overview")
            assert answer.status_code == 503
            assert answer.json()["redis"] == "down" and "Redis is not answering" in answer.json()["error"]
        assert app.get("/api/runs/some-run").status_code == 503
        assert app.get("/api/config").status_code == 200  # the page itself still loads
    assert [e["event"] for e in logs if e["event"].startswith("redis.")] == ["redis.lost"]


def test_a_busy_port_is_one_clear_line(monkeypatch):
    from click.testing import CliRunner

    from robot_lab.cli import main

    monkeypatch.delenv("REDIS_URL", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = CliRunner().invoke(main, ["dashboard", "--port", str(port)])
    assert out.exit_code == 1
    assert out.output.strip().splitlines()[-1] == (
        f"Error: cannot serve the dashboard on 127.0.0.1:{port}: Address already in use "
        "(another process listens there: pick another --port)")
