"""Redis out of memory (``maxmemory`` reached, ``noeviction``) is an outage, not a crash.

A private redis-server; a real ``robot-lab worker`` (in flight 4) serves a robot while a
fan-out run is in progress and a publish flood fills Redis up to its ``maxmemory``. While
Redis is full: the worker process stays up and ``robot-lab health`` says ``redis: out of
memory``; ``Bus.publish`` and ``Coordinator.submit`` raise one ``RedisOutOfMemory`` each, and
the refused submit leaves nothing behind (no record, no index entry, no rq job); the CLI prints
one line. After memory is freed every acknowledged message is answered, the accepted run
completes, nothing is dead-lettered and the worker never exited."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from robot_lab.bus import Bus
from robot_lab.errors import RedisOutOfMemory
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.fixtures.secure import APP
from tests.redis_server import RedisServer, wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid  # noqa: F401

pytestmark = pytest.mark.slow
PREFIX = "oomtest"
KEYS = Keys(PREFIX)


@pytest.fixture
def full_redis() -> Iterator[str]:
    private = RedisServer()
    url = private.start(private=True)
    if url is None:
        pytest.skip(f"no private redis-server: {private.reason}")
    redis.Redis.from_url(url).config_set("maxmemory-policy", "noeviction")
    try:
        yield url
    finally:
        private.stop()


def _fan_out(tasks: int) -> object:
    """``tasks`` parallel tasks of billing that each take 1.5 s (so they finish while Redis
    is full), then one after all of them."""
    net = create_network(f"oom-{uid()}")
    billing = build("billing", model="scripted/sleep:1500")
    for i in range(tasks):
        net.task(f"t{i}", billing)
    net.task("total", billing, depends_on=[f"t{i}" for i in range(tasks)])
    return net


@pytest.mark.timeout(360)  # its own waits go to 240 s: a loaded box answers the backlog slowly
def test_out_of_memory_is_ridden_out_and_nothing_acknowledged_is_lost(full_redis: str, tmp_path: Path,
                                                                      processes) -> None:  # noqa: F811
    admin = redis.Redis.from_url(full_redis)
    env = child_env(full_redis, PREFIX, ROBOT_LAB_WORKER_HEARTBEAT="0.3", ROBOT_LAB_HEALTH_DIR=str(tmp_path / "h"),
                    ROBOT_LAB_REDIS_RETRY_MAX="0.5")
    env.pop("ROBOT_LAB_TEST_REDIS_URL", None)
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP, "--in-flight", "4"],
                             env, "worker")
    bus = Bus(admin, keys=KEYS)
    bus.register("frontdesk")
    coordinator = Coordinator(connection=admin, keys=KEYS)
    try:
        wait_for(lambda: worker.poll() is not None or admin.zcard(KEYS.workers()) > 0, timeout=90)
        assert worker.poll() is None
        # an accepted fan-out run, then Redis capped a little above what it holds now
        accepted = coordinator.submit(_fan_out(6), "fan out")
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 1_500_000)
        acknowledged, refused = [], None
        for i in range(100_000):  # the flood: until Redis refuses
            try:
                # no conversation id: each runs on the serving slot's own default conversation,
                # which a redelivery after the outage meets differently; its journal replays
                acknowledged.append(bus.publish("billing", f"m{i} " + "x" * 2000, from_="frontdesk").id)
            except RedisOutOfMemory as exc:
                refused = exc
                break
        assert refused is not None and "Redis is out of memory" in str(refused) and acknowledged
        admin.config_set("maxmemory", 1)  # and it stays full, whatever the worker deletes meanwhile
        with pytest.raises(RedisOutOfMemory, match="network run"):
            coordinator.submit(_fan_out(2), "refused")
        runs = {r.decode() for r in admin.zrange(KEYS.runs_index(), 0, -1)}
        assert runs == {accepted.run_id}  # the refused submit left no index entry ...
        assert not admin.keys(f"{PREFIX}:run:*") or all(accepted.run_id in k.decode()
                                                         for k in admin.keys(f"{PREFIX}:run:*"))  # ... nor keys
        assert not [j for j in admin.keys("rq:job:*") if accepted.run_id not in j.decode()]  # ... nor jobs
        send = subprocess.run([str(VENV_BIN / "robot-lab"), "send", "billing", "hello", "--from", "cli"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert send.returncode == 1 and "out of memory" in send.stderr and "Traceback" not in send.stderr
        assert len(send.stderr.strip().splitlines()) == 1, send.stderr

        def health_says_oom() -> str | None:
            out = subprocess.run([str(VENV_BIN / "robot-lab"), "health"], env=env, capture_output=True, text=True,
                                 timeout=60).stdout
            return out if "redis: out of memory" in out else None

        wait_for(health_says_oom, timeout=60, interval=0.5)
        time.sleep(5)  # a while at full memory: the loops keep riding it out
        assert worker.poll() is None
        admin.config_set("maxmemory", 0)  # the operator frees memory

        def answered() -> bool:
            replies = [fields for _, fields in admin.xrange(KEYS.inbox("frontdesk"))]
            return len(replies) >= len(acknowledged)

        wait_for(answered, timeout=240, interval=1)
        result = accepted.wait(timeout=120)
    except Exception:
        print(processes.logs())
        raise
    import json

    replies = [json.loads(f[b"envelope"]) for _, f in admin.xrange(KEYS.inbox("frontdesk"))]
    assert {r["in_reply_to"] for r in replies} == set(acknowledged)
    assert result.status == "completed"
    assert bus.dead_letters("billing") == []
    assert worker.poll() is None
    log = Path(worker.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    assert "redis.lost" in log and "redis.back" in log and "Traceback" not in log, log[-3000:]
    lost = {json.loads(line)["component"].split("-")[0] for line in log.splitlines()
            if line.startswith("{") and '"redis.lost"' in line}
    assert {"bus", "heartbeat"} <= lost and any(c.startswith(("task", "rq")) for c in lost), lost  # fan-out too
    admin.close()
