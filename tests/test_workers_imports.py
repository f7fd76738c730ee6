"""What a worker process loads: a ``robot-lab worker`` whose robots run on
the scripted model handles its tasks without importing litellm, fastembed or MCP; one whose robot names a provider model imports litellm while warming up,
before its first task. Figures: bench/worker_memory.py, docs/operations.md ("Memory")."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.worker_procs import child_env, uid

pytestmark = pytest.mark.slow

# the worker of `robot-lab worker <robot> --burst`: it serves the robot's inbox and queue,
# drains the queue, stops, and says which top-level packages it had loaded
WORKER = r"""
import json, sys
from robot_lab.workers.process import run_worker
run_worker(sys.argv[1:], burst=True)
print("LOADED=" + json.dumps(sorted({name.split(".")[0] for name in sys.modules})), flush=True)
"""
# (not opentelemetry: redis-py >= 7 imports its metrics SDK by itself whenever it is installed)
HEAVY = {"litellm", "openai", "tiktoken", "tokenizers", "fastembed", "onnxruntime", "mcp", "prometheus_client",
         "starlette"}


def _worker_loaded(url: str, prefix: str, robot: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", WORKER, robot], env=child_env(url, prefix), capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOADED=")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return set(json.loads(lines[0].removeprefix("LOADED=")))


@pytest.fixture
def client(real_client):  # type: ignore[no-untyped-def]
    return real_client


def test_a_scripted_robots_worker_runs_its_task_without_litellm_or_fastembed(client, real_redis_url,  # type: ignore[no-untyped-def]
                                                                             key_prefix) -> None:
    bot = build(f"lean-{uid()}", model="scripted/echo")
    publish_specs([bot.to_spec()], connection=client)
    network = create_network("lean")
    network.task("only", bot)
    handle = Coordinator(connection=client).submit(network, "hi")
    loaded = _worker_loaded(real_redis_url, key_prefix, bot.name)
    assert handle.wait(timeout=10).reply == "echo: hi"  # the worker ran the task before it stopped
    assert "robot_lab" in loaded and not loaded & HEAVY, sorted(loaded & HEAVY)


def test_a_provider_models_worker_loads_litellm_before_its_first_task(client, real_redis_url,  # type: ignore[no-untyped-def]
                                                                       key_prefix) -> None:
    bot = build(f"real-{uid()}", model="openai/gpt-4o-mini")
    publish_specs([bot.to_spec()], connection=client)
    loaded = _worker_loaded(real_redis_url, key_prefix, bot.name)
    assert "litellm" in loaded
    assert not loaded & {"fastembed", "onnxruntime", "mcp"}
