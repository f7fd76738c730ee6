"""Traces and metrics across real processes on a real Redis: a worker process (the real
``robot-lab worker`` CLI under an SDK provider with the in-memory exporter, serving
``--metrics-port``) and this test process, which publishes a request and submits a network
run inside one span. All spans of both processes form one trace with the expected parents,
and a scrape of the worker's port afterwards shows the counters."""

from __future__ import annotations

import json
import signal
import sys
import urllib.request

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.bus import Bus
from robot_lab.keys import Keys
from robot_lab.observability import otel
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.runtime.rails.budget import RedisLedger
from tests.ports import free_port
from tests.redis_server import REPO_ROOT, wait_for
from tests.stopping import stopped
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

pytestmark = pytest.mark.slow
sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the [otel] extra is not installed")
pytest.importorskip("prometheus_client", reason="the [metrics] extra is not installed")


@pytest.fixture
def client(real_client):
    return real_client


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every robot_lab sample."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("robot_lab_"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_a_request_and_a_run_across_two_processes_form_one_trace_and_are_counted(
        client, real_redis_url, key_prefix, processes, memory_spans, tmp_path):  # noqa: F811
    keys = Keys(prefix=key_prefix)
    robot = build(f"otel-{uid()}", model="scripted/echo")
    publish_specs([robot.to_spec()], connection=client, keys=keys)
    spans_file = tmp_path / "worker-spans.json"
    port = free_port()
    env = child_env(real_redis_url, key_prefix)
    worker = processes.start([sys.executable, str(REPO_ROOT / "tests" / "otel_proc.py"), str(spans_file),
                              "worker", robot.name, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1",
                              "--metrics-gauges"], env, "worker")
    wait_for(lambda: client.exists(keys.inbox(robot.name)), timeout=60, interval=0.2)

    net = create_network("traced")
    net.task("answer", robot)
    with otel.span("test.client") as root:
        reply = Bus(redis=client, keys=keys).request(robot.name, "ping", timeout=60)
        handle = Coordinator(connection=client, keys=keys).submit(net, "hello")
        result = handle.wait(60)
    assert "ping" in str(reply.content) and result.status == "completed", processes.logs()

    # the reply reaches us before the worker's handler returns and counts it: scrape until it has
    wait_for(lambda: scrape(port).get(f'robot_lab_messages_handled_total{{robot="{robot.name}"}}') == 1,
             timeout=30, interval=0.1)
    samples = scrape(port)  # before stopping the worker: its counters, its robot's gauges
    worker.send_signal(signal.SIGTERM)
    assert stopped(worker) == 0

    local = [json.loads(json.dumps({"name": s.name, "trace_id": f"{s.context.trace_id:032x}",
                                    "span_id": f"{s.context.span_id:016x}",
                                    "parent_id": f"{s.parent.span_id:016x}" if s.parent else None}))
             for s in memory_spans.get_finished_spans()]
    remote = json.loads(spans_file.read_text())
    trace_id = f"{root.span.get_span_context().trace_id:032x}"
    ours = [s for s in local + remote if s["trace_id"] == trace_id]
    names = {s["name"] for s in ours}
    assert {"test.client", "bus.publish", "network.submit", "bus.handle", "task", "robot.run", "llm.call"} <= names
    by_id = {s["span_id"]: s for s in ours}
    handle_span = next(s for s in remote if s["name"] == "bus.handle")
    task_span = next(s for s in remote if s["name"] == "task")
    assert by_id[handle_span["parent_id"]]["name"] == "bus.publish"  # the parent lives in this process
    assert by_id[task_span["parent_id"]]["name"] == "network.submit"
    assert task_span["attributes"]["robot_lab.run_id"] == handle.run_id
    llm = [s for s in remote if s["name"] == "llm.call" and s["trace_id"] == trace_id]
    assert len(llm) == 2 and all(by_id[s["parent_id"]]["name"] == "robot.run" for s in llm)
    assert all(s["attributes"]["gen_ai.usage.output_tokens"] > 0 for s in llm)
    # the worker's spans carry the GenAI conventions (tests/test_observability_genai.py checks the keys)
    assert all(s["attributes"]["gen_ai.operation.name"] == "chat" and s["attributes"]["gen_ai.provider.name"]
               == "scripted" for s in llm)
    agents = [s for s in remote if s["name"] == "robot.run" and s["trace_id"] == trace_id]
    assert len(agents) == 2 and all(s["attributes"]["gen_ai.operation.name"] == "invoke_agent"
                                    and s["attributes"]["gen_ai.agent.name"] == robot.name for s in agents)

    name = robot.name
    assert samples[f'robot_lab_messages_handled_total{{robot="{name}"}}'] == 1
    assert samples[f'robot_lab_handler_seconds_count{{robot="{name}"}}'] == 1
    assert samples[f'robot_lab_messages_in_flight{{robot="{name}"}}'] == 0
    assert samples[f'robot_lab_tasks_total{{outcome="done",robot="{name}"}}'] == 1
    assert samples[f'robot_lab_llm_calls_total{{model="scripted/echo",outcome="ok",robot="{name}"}}'] == 2
    # the worker's warm-up call at start is no model call of anyone's: not counted
    assert [k for k in samples if k.startswith("robot_lab_llm_calls_total")] == [
        f'robot_lab_llm_calls_total{{model="scripted/echo",outcome="ok",robot="{name}"}}']
    assert samples[f'robot_lab_llm_tokens_total{{direction="output",model="scripted/echo",robot="{name}"}}'] > 0
    assert samples[f'robot_lab_queue_depth{{queue="tasks",robot="{name}"}}'] == 0
    assert samples[f'robot_lab_stream_lag{{robot="{name}"}}'] == 0
    assert samples["robot_lab_redis_up"] == 1
    assert samples[f'robot_lab_task_seconds_count{{outcome="done",robot="{name}"}}'] == 1  # per robot
    assert samples[f'robot_lab_task_seconds_sum{{outcome="done",robot="{name}"}}'] > 0
    # the fleet-wide gauges come from the one exporter (`robot-lab metrics`), never from each worker
    assert not [k for k in samples if k.startswith(("robot_lab_runs_", "robot_lab_workers_live",
                                                    "robot_lab_budget_remaining"))]


def test_the_standalone_exporter_reads_queues_dead_letters_and_budgets(client, real_redis_url, key_prefix,
                                                                      processes):  # noqa: F811
    keys = Keys(prefix=key_prefix)
    idle = build(f"idle-{uid()}", model="scripted/echo")
    publish_specs([idle.to_spec()], connection=client, keys=keys)
    bus = Bus(redis=client, keys=keys)
    bus.register(idle.name)
    for text in ("one", "two", "three"):
        bus.publish(idle.name, text)
    client.xadd(keys.dlq(idle.name), {"envelope": "{}", "reason": "invalid"})
    net = create_network("queued")
    net.task("wait", idle)
    Coordinator(connection=client, keys=keys).submit(net, "nobody serves me")  # no worker: stays queued
    ledger = RedisLedger("tenant:acme", limits={"tokens": 1000}, redis=client, keys=keys)
    ledger.reserve("tokens", 250)
    ledger.reconcile("tokens", 250, 100)

    port = free_port()
    env = child_env(real_redis_url, key_prefix)
    processes.start([str(VENV_BIN / "robot-lab"), "metrics", "--port", str(port), "--addr", "127.0.0.1"], env,
                    "exporter")
    samples: dict[str, float] = {}

    def scraped() -> bool:
        nonlocal samples
        try:
            samples = scrape(port)
        except OSError:
            return False
        return True

    wait_for(scraped, timeout=60, interval=0.2)
    name = idle.name
    assert samples[f'robot_lab_queue_depth{{queue="bus",robot="{name}"}}'] == 3
    assert samples[f'robot_lab_stream_lag{{robot="{name}"}}'] == 3
    assert samples[f'robot_lab_queue_depth{{queue="tasks",robot="{name}"}}'] == 1
    assert samples[f'robot_lab_dlq_size{{robot="{name}"}}'] == 1
    # per robot, so "work queued and no worker" is one alert rule: queue_depth > 0 and workers_live == 0
    assert samples[f'robot_lab_workers_live{{robot="{name}"}}'] == 0
    assert samples['robot_lab_budget_remaining{dimension="tokens",scope="tenant:acme"}'] == 900
    assert samples["robot_lab_runs_active"] >= 1
    assert not any(k.startswith("robot_lab_messages_handled") for k in samples)  # no process counters here



def test_a_worker_with_forked_children_adds_their_counters_up_behind_one_port(
        client, real_redis_url, key_prefix, processes):  # noqa: F811
    keys = Keys(prefix=key_prefix)
    robot = build(f"multi-{uid()}", model="scripted/echo")
    publish_specs([robot.to_spec()], connection=client, keys=keys)
    port = free_port()
    env = child_env(real_redis_url, key_prefix)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", robot.name, "--concurrency", "2",
                     "--metrics-port", str(port)], env, "worker")
    net = create_network("fanout")
    for name in ("one", "two", "three", "four"):
        net.task(name, robot)
    handle = Coordinator(connection=client, keys=keys).submit(net, "count me")
    try:
        result = handle.wait(90)
    except Exception as exc:
        raise AssertionError(processes.logs()) from exc
    assert result.status == "completed", processes.logs()
    samples = scrape(port)
    done = samples[f'robot_lab_tasks_total{{outcome="done",robot="{robot.name}"}}']
    assert done == 4  # run in the children, read by the parent's exporter
    assert samples[f'robot_lab_task_seconds_count{{outcome="done",robot="{robot.name}"}}'] == 4
    assert not [k for k in samples if k.startswith("robot_lab_queue_depth")]  # no --metrics-gauges
    assert samples[f'robot_lab_llm_calls_total{{model="scripted/echo",outcome="ok",robot="{robot.name}"}}'] == 4


def listening_hosts(port: int) -> set[str]:
    """The addresses a TCP socket of this machine listens on at ``port`` (from /proc/net/tcp*)."""
    import ipaddress

    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            hex_addr, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(hex_addr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            hosts.add(str(ipaddress.ip_address(raw)))
    return hosts


@pytest.mark.skipif(not __import__("os").path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp (Linux)")
def test_metrics_endpoints_listen_on_loopback_unless_widened(client, real_redis_url, key_prefix,
                                                            processes):  # noqa: F811
    """A worker's --metrics-port and `robot-lab metrics` bind 127.0.0.1 by default (like the
    dashboard); --metrics-addr widens either one."""
    keys = Keys(prefix=key_prefix)
    robot = build(f"bind-{uid()}", model="scripted/echo")
    publish_specs([robot.to_spec()], connection=client, keys=keys)
    env = child_env(real_redis_url, key_prefix)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cli = str(VENV_BIN / "robot-lab")
    worker_port, exporter_port, wide_port = free_port(), free_port(), free_port()
    processes.start([cli, "worker", robot.name, "--metrics-port", str(worker_port)], env, "worker")
    processes.start([cli, "metrics", "--port", str(exporter_port)], env, "exporter")
    processes.start([cli, "metrics", "--port", str(wide_port), "--metrics-addr", "0.0.0.0"], env, "wide")
    for port in (worker_port, exporter_port, wide_port):
        wait_for(lambda: listening_hosts(port), timeout=60, interval=0.2)
    assert listening_hosts(worker_port) == {"127.0.0.1"}, processes.logs()
    assert listening_hosts(exporter_port) == {"127.0.0.1"}, processes.logs()
    assert listening_hosts(wide_port) == {"0.0.0.0"}, processes.logs()
    # the exporter counts the worker's heartbeat under its robot
    wait_for(lambda: scrape(exporter_port).get(f'robot_lab_workers_live{{robot="{robot.name}"}}') == 1,
             timeout=60, interval=0.2)
