"""What a worker process loads: a ``robot-lab worker`` whose robots run on
the scripted model handles its tasks without importing litellm, fastembed or MCP; one whose
robot names a provider model is ready before litellm has loaded (on a thread of its own). Figures: bench/worker_memory.py, docs/operations.md ("Memory")."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.worker_procs import child_env, processes, uid  # noqa: F401

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


def test_a_provider_models_worker_is_ready_before_litellm_has_loaded(client, real_redis_url, key_prefix,  # type: ignore[no-untyped-def]
                                                                     processes) -> None:  # noqa: F811
    """A worker whose robot names a provider model loads litellm on a thread of its own: rq
    has its worker registered (and its inbox a consumer) before litellm is loaded, and
    litellm is loaded soon after, before any provider call needs it."""
    import datetime

    from rq import Queue, Worker

    from robot_lab.keys import Keys
    from tests.redis_server import wait_for
    from tests.worker_procs import VENV_BIN, wait_for_workers

    bot = build(f"real-{uid()}", model="openai/gpt-4o-mini")
    publish_specs([bot.to_spec()], connection=client)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_LOG_LEVEL="INFO")
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name], env, "worker")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=90)
    wait_for(lambda: client.exists(Keys(prefix=key_prefix).inbox(bot.name)), timeout=30)
    born = Worker.all(queue=Queue(f"robot:{bot.name}", connection=client))[0].birth_date

    def loaded() -> dict | None:
        for line in proc.log_path.read_text(errors="replace").splitlines():  # type: ignore[attr-defined]
            if '"worker.litellm_loaded"' in line:
                return json.loads(line)
        return None

    wait_for(lambda: loaded() is not None, timeout=120, interval=0.2)
    at = datetime.datetime.fromisoformat(loaded()["timestamp"].replace("Z", "+00:00"))
    assert born.replace(tzinfo=datetime.timezone.utc) < at, (born, at)
    assert proc.poll() is None


def test_a_warmed_up_worker_has_imported_what_its_first_task_imports() -> None:
    """warm_up() (every worker process, before it takes a job) imports the robot runtime, so
    the first task of each process does not pay ~50 ms of imports on its clock."""
    code = ("import sys\nfrom robot_lab.workers.process import warm_up\nwarm_up(['scripted/echo'])\n"
            "print('ROBOT=' + str('robot_lab.runtime.robot' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=child_env("", "warm"))
    assert "ROBOT=True" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
