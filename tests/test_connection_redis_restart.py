"""A Redis restart (AOF) mid-run is ridden out.

A private redis-server with ``--appendonly yes`` (never the session's server: this test
stops it) serves three ``robot-lab worker`` processes (one with ``--concurrency 2``), a
``robot-lab watch --all`` coordinator and a ``robot-lab run`` waiting for a fan-out /
fan-in network. While tasks run and bus messages are being handled, Redis is stopped and
started again on the same port and data directory. Then:

* every worker, the watcher and the waiting ``robot-lab run`` are still up, and the run
  completes with every task done (in-flight tasks finished or were re-run by lease);
* a second restart, with everything idle, is ridden out too, and SIGTERM still stops every
  worker cleanly afterwards;
* every bus message sent before and after the restart is answered;
* each process logged the outage as ``redis.lost`` / ``redis.back`` lines -- a handful per
  process, never a traceback, never rq's per-attempt reconnect errors;
* ``robot-lab health`` passes for every worker again.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from robot_lab.runtime.registry import publish_specs
from robot_lab.bus import Bus
from robot_lab.keys import Keys
from robot_lab.runtime.robot import build
from robot_lab.schemas import decode_message
from tests.ports import free_port
from tests.redis_server import REPO_ROOT, wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers, write_fan_network  # noqa: F401

pytestmark = pytest.mark.slow

TASKS = 8


class AofRedis:
    """A redis-server with AOF on a free port, restartable on the same port and dir."""

    def __init__(self, directory: Path) -> None:
        self.binary = shutil.which("redis-server")
        self.port = free_port()
        self.dir = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.binary
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(up, interval=0.05)
        client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: Redis flushes the AOF and exits; SIGKILL: a crash (``appendfsync always``
        keeps every acknowledged write, so this is a restart test, not a data loss test)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None


@pytest.fixture
def aof_redis(tmp_path):
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server binary on PATH")
    data = tmp_path / "redis-data"
    data.mkdir()
    server = AofRedis(data)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _log_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"event": "(raw)", "raw": line})
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "crash"])
def test_fleet_rides_out_a_redis_restart(aof_redis, tmp_path, processes, sig):  # noqa: F811
    prefix = f"rltest-{uid()}"
    keys = Keys(prefix=prefix)
    client = redis.Redis.from_url(aof_redis.url)
    robot = f"steady-{uid()}"
    publish_specs([build(robot, model="scripted/sleep:1500").to_spec()], connection=client, keys=keys)
    module_dir = tmp_path / "mods"
    write_fan_network(module_dir, "restartnet", robot, tasks=TASKS, sleep_ms=1500, name="restart")
    env = child_env(aof_redis.url, prefix, ROBOT_LAB_WORKER_HEARTBEAT="0.5",
                    ROBOT_LAB_HEALTH_DIR=str(tmp_path / "health"), ROBOT_LAB_REDIS_RETRY_MAX="1.0",
                    PYTHONPATH=f"{module_dir}:{REPO_ROOT}")
    cli = str(VENV_BIN / "robot-lab")
    workers = [processes.start([cli, "worker", robot], env, "worker-a"),
               processes.start([cli, "worker", robot], env, "worker-b"),
               processes.start([cli, "worker", robot, "--concurrency", "2"], env, "worker-c")]
    watcher = processes.start([cli, "watch", "--all"], env, "watch")
    wait_for_workers(client, [f"robot:{robot}"], timeout=120)
    wait_for(lambda: len(client.smembers(f"rq:workers:robot:{robot}")) == 4, timeout=120, interval=0.2)

    bus = Bus(client, keys=keys)
    reply_box = f"client-{uid()}"
    bus.register(reply_box)
    sent = [bus.publish(robot, f"before {i}", from_=reply_box, reply_to=reply_box).id for i in range(6)]
    runner = processes.start([cli, "run", "restartnet:network", "go", "--json"], env, "run")

    # tasks and messages in flight: some tasks started, none finished yet
    def events() -> list[dict]:
        runs = client.zrange(keys.runs_index(), 0, -1)
        if not runs:
            return []
        stream = f"{keys.run(runs[0].decode())}:events"
        return [json.loads(f[b"event"]) for _, f in client.xrange(stream)]

    wait_for(lambda: sum(e["event"] == "task.started" for e in events()) >= 2, timeout=120, interval=0.05)
    client.close()
    aof_redis.stop(sig)
    time.sleep(3)  # long enough for every loop to notice, short of the rq/bus timeouts
    for proc in (*workers, watcher, runner):
        assert proc.poll() is None, processes.logs()
    aof_redis.start()
    client = redis.Redis.from_url(aof_redis.url)
    bus = Bus(client, keys=keys)
    sent += [bus.publish(robot, f"after {i}", from_=reply_box, reply_to=reply_box).id for i in range(4)]

    runner.wait(240)
    run_log = _log_lines(Path(runner.log_path))  # type: ignore[attr-defined]
    assert runner.returncode == 0, processes.logs()
    [result] = [line for line in run_log if "states" in line]
    assert result["status"] == "completed"
    # the waiting coordinator saw the outage and came back (one line each)
    assert [line["event"] for line in run_log if line.get("component") == "coordinator"] == \
        ["redis.lost", "redis.back"], processes.logs()
    assert set(result["states"].values()) == {"done"} and len(result["states"]) == TASKS + 1

    def answered() -> set[str]:
        return {decode_message(f[b"envelope"]).in_reply_to for _, f in client.xrange(keys.inbox(reply_box))}

    wait_for(lambda: set(sent) <= answered(), timeout=120, interval=0.2)
    assert bus.dlq_size(robot) == 0

    # a second restart while everything is idle: every rq loop, bus poller, sweeper and the
    # idle `watch --all` see it, and still stop cleanly on SIGTERM afterwards
    client.close()
    aof_redis.stop(sig)
    time.sleep(2)
    aof_redis.start()
    client = redis.Redis.from_url(aof_redis.url)
    for proc in (*workers, watcher):
        assert proc.poll() is None, processes.logs()
    probe = subprocess.run([cli, "health"], env=env, capture_output=True, text=True, timeout=60)
    for _ in range(60):
        if probe.returncode == 0:
            break
        time.sleep(0.5)
        probe = subprocess.run([cli, "health"], env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stdout + processes.logs()
    assert probe.stdout.count(": ok (") == 5  # 3 worker processes + 2 rq children

    def transitions(proc: subprocess.Popen[bytes]) -> tuple[Counter[str], Counter[str]]:
        lines = _log_lines(Path(proc.log_path))  # type: ignore[attr-defined]
        return (Counter(line.get("component") for line in lines if line.get("event") == "redis.lost"),
                Counter(line.get("component") for line in lines if line.get("event") == "redis.back"))

    for proc in (*workers, watcher):
        # liveness stays green through an outage, so a loop may still be in its last backoff
        wait_for(lambda: transitions(proc)[0] == transitions(proc)[1], timeout=60, interval=0.2)
        lost, back = transitions(proc)
        text = Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
        assert "Traceback" not in text and "could not connect to Redis instance" not in text, text[-3000:]
        assert lost, text[-3000:]  # the outages were seen ...
        assert all(n <= 2 for n in lost.values()), lost  # ... logged per state change, not per retry
        if proc is not watcher:
            assert any(c.startswith("rq ") for c in lost) and any(c.startswith("bus-") for c in lost), lost
    for proc in (*workers, watcher):
        proc.send_signal(signal.SIGTERM)
    for proc in (*workers, watcher):
        proc.wait(60)
    assert [p.returncode for p in workers] == [0, 0, 0], processes.logs()
    client.close()


def test_a_demoted_primary_is_ridden_out_until_promoted(aof_redis, tmp_path):
    """A failover seen from a client that still talks to the old primary: writes answer
    READONLY. The client drops such connections (so a managed Redis's DNS is re-resolved) and
    a loop's tracker treats it as an outage -- one lost/back pair -- until a primary answers."""
    import threading

    from robot_lab.connection import connect
    from robot_lab.outage import Backoff, OutageTracker

    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = AofRedis(other_dir)
    other.start()
    admin = redis.Redis.from_url(aof_redis.url)
    client = connect(aof_redis.url)
    try:
        assert client.set("k", "before")
        admin.replicaof("127.0.0.1", other.port)  # demoted: a replica of another server
        wait_for(lambda: admin.info("replication")["role"] == "slave")
        with pytest.raises(redis.exceptions.ReadOnlyError):
            client.set("k", "during")
        lines: list[str] = []

        class Log:
            def warning(self, event: str, **kw: object) -> None:
                lines.append(event)

        promote = threading.Timer(1.0, lambda: admin.replicaof("NO", "ONE"))
        promote.start()
        tracker = OutageTracker("test", backoff=Backoff(0.05, 0.2), logger=Log())
        assert tracker.call(lambda: client.set("k", "after")) is True
        promote.join()
        assert lines == ["redis.lost", "redis.back"]
        assert client.get("k") == b"after"
    finally:
        client.close()
        admin.close()
        other.stop()
