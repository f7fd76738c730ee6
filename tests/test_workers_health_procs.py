"""With real processes: ``robot-lab health`` (the Kubernetes probes) fails,
naming the loop, when a loop of a ``robot-lab worker`` cannot serve -- here a bus poller whose
inbox key holds a string from start-up (creating the consumer group fails with WRONGTYPE: the
poller names the key and keeps trying) and, with ``--concurrency 2``, an rq child process
killed with -9. The robot next to the broken one keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from robot_lab.runtime.registry import publish_specs
from robot_lab.bus import Bus
from robot_lab.keys import Keys
from robot_lab.runtime.robot import build
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

pytestmark = pytest.mark.slow


def _probe(env: dict[str, str], pid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "robot-lab"), "health", "--worker", f".{pid}"], env=env,
                          capture_output=True, text=True, timeout=60)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


@pytest.mark.not_hardened(reason="probes one worker process serving two robots; in the hardened profile each robot "
                                  "has its own worker process (one Redis user each), so that process does not exist")
def test_health_names_dead_bus_thread_and_dead_rq_child(real_redis_url, key_prefix, tmp_path, processes):  # noqa: F811
    client = redis.Redis.from_url(real_redis_url)
    keys = Keys(prefix=key_prefix)
    good, bad = f"good-{uid()}", f"bad-{uid()}"
    publish_specs([build(good, model="scripted/echo").to_spec(), build(bad, model="scripted/echo").to_spec()],
                  connection=client, keys=keys)
    client.set(keys.inbox(bad), "not a stream")  # the injected start-up failure
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_WORKER_HEARTBEAT="0.3",
                    ROBOT_LAB_HEALTH_DIR=str(tmp_path / "health"))
    cli = str(VENV_BIN / "robot-lab")
    single = processes.start([cli, "worker", good, bad], env, "single")
    multi = processes.start([cli, "worker", good, "--concurrency", "2"], env, "multi")
    try:
        # from start-up on: never "ok" while the bus thread of `bad` is dead
        def named() -> subprocess.CompletedProcess[str] | None:
            probe = _probe(env, single.pid)
            assert probe.returncode != 0 or "ok (" not in probe.stdout, probe.stdout
            return probe if f"bus-{bad}: {keys.inbox(bad)} is a string, not a stream" in probe.stdout else None

        probe = wait_for(named, timeout=120, interval=0.3)
        assert probe.returncode == 1
        assert "unhealthy" in probe.stdout and "died" not in probe.stdout
        assert single.poll() is None  # the process stays up; the probe makes the orchestrator act

        # the healthy robot of the same process still answers
        bus = Bus(client, keys=keys)
        reply = bus.request(good, "still there?", timeout=60)
        assert reply.content == "echo: still there?"

        # --concurrency 2: both rq children and the parent beat; kill one child
        def healthy_multi() -> bool:
            probe = _probe(env, multi.pid)
            return probe.returncode == 0 and probe.stdout.count("ok (") == 3

        wait_for(healthy_multi, timeout=120, interval=0.3)
        child = _children(multi.pid)[0]
        os.kill(child, signal.SIGKILL)

        def child_named() -> subprocess.CompletedProcess[str] | None:
            probe = _probe(env, multi.pid)
            return probe if probe.returncode == 1 and "exited with code -9" in probe.stdout else None

        probe = wait_for(child_named, timeout=60, interval=0.3)
        assert f"(pid {child})" in probe.stdout
    finally:
        client.delete(keys.inbox(bad))
        client.close()
