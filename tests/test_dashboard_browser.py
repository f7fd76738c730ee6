"""``robot-lab dashboard`` in a real headless Chromium (Debian's ``chromium`` package, driven
by Playwright's Python package with ``executable_path``; no browser is downloaded), against a
real worker process and a real Redis: the page loads a run while it is running, follows it
over SSE and sees every task of the DAG and the run complete, with streamed replies, memory
changes, tokens; the overview lists the robot and its worker; the DLQ view is read-only
without a token, and with ``--allow-actions`` a replay needs the token.

Skips, saying why, when chromium or playwright is absent. With
``ROBOT_LAB_SCREENSHOTS=<dir>`` it saves the PNGs used in docs/observability.md.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.bus import Bus
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.ports import free_port
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the test extra) is not installed")
pytest.importorskip("starlette", reason="the [dashboard] extra is not installed")


@pytest.fixture
def client(real_client):
    return real_client


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def start_dashboard(processes, env, *extra: str) -> str:  # noqa: F811
    port = free_port()
    processes.start([str(VENV_BIN / "robot-lab"), "dashboard", "--port", str(port), *extra], env,
                    f"dashboard-{port}")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(base + "/api/config", timeout=5).status == 200
        except OSError:
            return False

    wait_for(up, timeout=60, interval=0.2)
    return base


def post(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def screenshot(page, name: str, tmp_path: Path) -> None:
    target = Path(os.environ.get("ROBOT_LAB_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / name))
    try:  # docs screenshots: a 64-colour palette keeps each PNG a few dozen KB
        from PIL import Image

        with Image.open(target / name) as image:
            image.convert("RGB").quantize(64).save(target / name, optimize=True)
    except ImportError:
        pass


def test_the_dashboard_follows_a_live_run_to_completion(client, real_redis_url, key_prefix, processes,  # noqa: F811
                                                        browser, tmp_path):
    keys = Keys(prefix=key_prefix)
    robot = build(f"desk-{uid()}", model="scripted/sleep:1200")
    publish_specs([robot.to_spec()], connection=client, keys=keys)
    env = child_env(real_redis_url, key_prefix)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", robot.name, "--concurrency", "2"], env, "worker")
    base = start_dashboard(processes, env)
    wait_for(lambda: client.exists(keys.inbox(robot.name)), timeout=60, interval=0.2)

    net = create_network("support")
    net.task("triage", robot, memory_key="triage")
    net.task("billing", robot, depends_on="triage")
    net.task("technical", robot, depends_on="triage")
    net.task("answer", robot, depends_on=["billing", "technical"], memory_key="answer")
    handle = Coordinator(connection=client, keys=keys).submit(net, "my invoice is wrong")

    page = browser.new_page(viewport={"width": 1100, "height": 720})
    page.goto(f"{base}/#/run/{handle.run_id}")
    page.wait_for_selector("#dag g.node", timeout=30_000)
    first = page.locator("#run-status").inner_text()
    assert first == "running"  # loaded while the run was live
    page.wait_for_selector("#run-view[data-live='ended']", timeout=90_000)
    assert page.locator("#run-status").inner_text() == "completed"
    states = page.eval_on_selector_all("#dag g.node", "ns => ns.map(n => [n.dataset.task, n.dataset.state])")
    assert dict(states) == {"triage": "done", "billing": "done", "technical": "done", "answer": "done"}
    assert "echo:" in page.locator("#task-answer pre.text").inner_text()
    events = page.locator("#events").inner_text()
    assert "task.started triage" in events and "run.completed" in events
    memory = page.locator("#memory").inner_text()
    assert "set triage" in memory and "set answer" in memory
    assert "tokens" in page.locator("#run-totals").inner_text()
    screenshot(page, "dashboard-run.png", tmp_path)

    page.goto(f"{base}/#/")
    page.wait_for_selector(f"#robots td:text('{robot.name}')", timeout=30_000)
    page.wait_for_selector(f"#recent a[href='#/run/{handle.run_id}']", timeout=30_000)
    assert page.locator("#mode").inner_text() == "read-only"
    screenshot(page, "dashboard-overview.png", tmp_path)
    page.close()


def test_actions_are_off_by_default_and_need_the_token(client, real_redis_url, key_prefix, processes,  # noqa: F811
                                                       browser):
    keys = Keys(prefix=key_prefix)
    name = f"dead-{uid()}"
    bus = Bus(redis=client, keys=keys)
    bus.register(name)
    client.xadd(keys.dlq(name), {"envelope": json.dumps({"content": "lost message"}), "reason": "failed",
                                 "error": "boom", "deliveries": "3", "robot": name})
    env = child_env(real_redis_url, key_prefix)
    read_only = start_dashboard(processes, env)
    assert post(f"{read_only}/api/dlq/{name}/replay")[0] == 403
    page = browser.new_page()
    page.goto(f"{read_only}/#/dlq/{name}")
    page.wait_for_selector("#dlq td:text('boom')", timeout=30_000)
    assert page.locator("#dlq button").count() == 0 and page.locator("#replay-all").is_hidden()
    page.close()

    token = "s3cret-" + uid()
    acting = start_dashboard(processes, dict(env, ROBOT_LAB_DASHBOARD_TOKEN=token), "--allow-actions")
    assert post(f"{acting}/api/dlq/{name}/replay")[0] == 401
    assert post(f"{acting}/api/dlq/{name}/replay", "wrong")[0] == 401
    assert client.xlen(keys.dlq(name)) == 1
    page = browser.new_page()
    page.goto(f"{acting}/#/dlq/{name}")
    page.fill("#token", token)
    page.click("#dlq button:text('Replay')")
    wait_for(lambda: client.xlen(keys.dlq(name)) == 0, timeout=30)
    assert client.xlen(keys.inbox(name)) == 1  # back on the inbox
    page.close()


def test_the_dashboard_shows_routes_tool_calls_running_tasks_failures_and_re_runs(  # noqa: F811
        client, real_redis_url, key_prefix, processes, browser, tmp_path):
    from tests.fixtures.tools import add

    keys = Keys(prefix=key_prefix)
    router = build(f"router-{uid()}", model="scripted/route:billing")
    # a provider's error is one long line: the failed-tasks table still fits 1200 px
    billing = build(f"billing-{uid()}", model="scripted/fail:card processor down"
                    + " (the gateway answered 503 Service Unavailable to every retry)" * 4)
    calc = build(f"calc-{uid()}", model="scripted/sleep:1500", local_tools=[add])
    closer = build(f"closer-{uid()}", model="scripted/text:Case closed.")
    robots = [router, billing, calc, closer]
    publish_specs([r.to_spec() for r in robots], connection=client, keys=keys)
    env = child_env(real_redis_url, key_prefix)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", *(r.name for r in robots), "--no-bus"], env, "worker")
    token = "s3cret-" + uid()
    base = start_dashboard(processes, dict(env, ROBOT_LAB_DASHBOARD_TOKEN=token), "--allow-actions")

    net = create_network("desk")
    net.task("classify", router, routes=["billing", "general"])
    net.task("billing", billing, depends_on="optional", retries=0)
    net.task("general", router, depends_on="optional")
    net.task("sum", calc, depends_on="classify", tools=["add"])
    net.task("close", closer, depends_on="billing")  # runs after the failure, and again on its re-run
    handle = Coordinator(connection=client, keys=keys).submit(net, "refund my card")

    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.goto(f"{base}/#/run/{handle.run_id}")
    page.wait_for_selector("#dag g.node", timeout=30_000)
    # routing edges are drawn (dashed) from the router to its optional tasks
    routes = page.eval_on_selector_all("#dag path.route", "ps => ps.map(p => [p.dataset.from, p.dataset.to])")
    assert sorted(routes) == [["classify", "billing"], ["classify", "general"]]
    # a running task shows when it started, for how long, and on which worker
    page.wait_for_selector("#task-sum .running-info", timeout=60_000)
    info = page.locator("#task-sum .running-info").inner_text()
    assert "started" in info and "on robot-lab." in info
    # tool calls: name and arguments, then the result
    page.wait_for_selector("#task-sum li.call", timeout=60_000)
    assert 'add({"a":0,"b":0})' in page.locator("#task-sum li.call").inner_text()
    page.wait_for_function("document.querySelector('#task-sum li.call').innerText.includes('→')", timeout=60_000)
    assert page.locator("#task-sum li.call").inner_text().endswith("→ 0")  # the result, not [object Object]
    page.wait_for_selector("#run-view[data-live='ended']", timeout=90_000)
    assert page.locator("#run-status").inner_text() == "completed_with_errors"
    assert "1 failed" in page.locator("#run-totals").inner_text()
    page.reload()  # the snapshot of the finished run carries each task's input
    page.wait_for_selector("#run-view[data-live='ended']", timeout=30_000)
    assert page.locator("#task-billing details.input pre").text_content() == "refund my card"

    # the overview lists the failed task with its error, and re-runs it with the token
    page.goto(f"{base}/#/")
    row = page.wait_for_selector(f"#failed-tasks tr:has(a[href='#/run/{handle.run_id}'])", timeout=30_000)
    assert "card processor down" in row.inner_text() and "billing" in row.inner_text()
    page.fill("#token", token)
    button = page.locator(f"#failed-tasks tr:has(a[href='#/run/{handle.run_id}']) button:text('Re-run')")
    box = button.bounding_box()
    assert box and box["x"] + box["width"] <= 1200, box  # in view, not past the right edge
    assert page.evaluate("document.documentElement.scrollWidth") <= 1200
    button.click()
    wait_for(lambda: handle.store.attempts().get("billing") == 2, timeout=60)
    page.wait_for_selector("#run-view[data-live='ended']", timeout=90_000)  # followed the re-run to its end
    assert page.locator("#run-status").inner_text() == "completed_with_errors"  # the card processor is still down
    assert handle.store.attempts().get("close") == 2
    assert page.locator("#task-close pre.text").inner_text() == "Case closed."  # this attempt's text, once
    page.reload()
    page.wait_for_selector("#run-view[data-live='ended']", timeout=30_000)
    assert page.locator("#task-close pre.text").inner_text() == "Case closed."
    assert page.locator("#task-sum li.call").inner_text().endswith("→ 0")
    screenshot(page, "dashboard-failed.png", tmp_path)
    page.close()


def test_the_page_shows_a_banner_while_redis_is_away(processes, browser, tmp_path):  # noqa: F811
    dead = free_port()
    env = child_env(f"redis://127.0.0.1:{dead}/0", "rl-away")
    base = start_dashboard(processes, env)
    page = browser.new_page()
    page.goto(f"{base}/#/")
    page.wait_for_selector("#banner:not([hidden])", timeout=60_000)
    assert "Redis is not answering" in page.locator("#banner").inner_text()
    page.close()
    log = processes.logs()
    assert "Traceback" not in log and log.count("redis.lost") == 1, log
    assert f"dashboard on {base}/ (read-only; Ctrl-C stops it)" in log  # where to point the browser


def test_a_waiting_task_is_answered_and_approved_from_the_page(client, real_redis_url, key_prefix, processes,  # noqa: F811
                                                               browser):
    from tests.redis_server import REPO_ROOT

    keys = Keys(prefix=key_prefix)
    robot = build(f"asker-{uid()}", model="scripted/ask_refund",
                  local_tools=["robot_lab.runtime.durable.human:AskUser", "tests.fixtures.durable_tools:big_refund"])
    publish_specs([robot.to_spec()], connection=client, keys=keys)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_SCRIPTS_DIR=str(REPO_ROOT / "tests" / "fixtures" / "scripts"))
    processes.start([str(VENV_BIN / "robot-lab"), "worker", robot.name, "--no-bus"], env, "worker")
    token = "s3cret-" + uid()
    base = start_dashboard(processes, dict(env, ROBOT_LAB_DASHBOARD_TOKEN=token), "--allow-actions")
    net = create_network("ask")
    net.task("ask", robot, tools="inherit")
    handle = Coordinator(connection=client, keys=keys).submit(net, "refund please")

    page = browser.new_page()
    page.goto(f"{base}/#/run/{handle.run_id}")
    page.fill("#token", token)
    page.wait_for_selector("#task-ask .state.waiting", timeout=60_000)
    assert "Which order?" in page.locator("#task-ask .asks").inner_text()
    page.fill("#task-ask .asks input", "2")
    page.click("#task-ask .asks button:text('Answer')")
    page.wait_for_selector("#task-ask .asks button:text('Approve')", timeout=60_000)
    page.click("#task-ask .asks button:text('Approve')")
    page.wait_for_selector("#run-view[data-live='ended']", timeout=60_000)
    assert page.locator("#run-status").inner_text() == "completed"
    assert "refunded A1 (approved)" in handle.result().reply and "ask_user: B2" in handle.result().reply
    by = [e.data.get("by") for e in handle.events() if e.event == "hitl.resolved"]
    assert by == ["dashboard", "dashboard"]
    page.close()
