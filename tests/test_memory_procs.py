"""Memory across real processes on a real Redis: concurrent compare-and-set, a durable
subscriber killed with SIGKILL and restarted, blocking reads woken by another process, and
pub/sub reconnects.

Roles live in tests/memory_proc.py; every subprocess is killed in ``finally``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from robot_lab.keys import Keys
from robot_lab.memory.store import Memory
from tests.redis_server import REPO_ROOT, wait_for

pytestmark = [pytest.mark.real_redis, pytest.mark.slow]


@pytest.fixture
def env(real_redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    return {**os.environ, "REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix,
            "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture
def client(real_redis_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(real_redis_url)
    yield client
    keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def spawn(procs: list[subprocess.Popen[str]], env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.memory_proc", *args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    return proc


def numsub(client: redis.Redis, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))


def test_four_processes_incrementing_lose_no_update(env: dict[str, str], client: redis.Redis, key_prefix: str,
                                                    procs: list[subprocess.Popen[str]]) -> None:
    scope = f"counter-{uuid.uuid4().hex[:6]}"
    memory = Memory(scope, redis=client, keys=Keys(prefix=key_prefix))
    workers = [spawn(procs, env, "counter", scope, "500") for _ in range(4)]
    # All four block on "go" first, so the increments really overlap.
    wait_for(lambda: numsub(client, memory.keys_layout.memory_channel(scope)) == 4, 30)
    memory["go"] = True
    for proc in workers:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
    assert memory["counter"] == 2000
    counts = [c.value for c in memory.changes() if c.key == "counter"]
    assert counts == list(range(1, 2001))  # every increment recorded once, in order
    assert len({c.writer for c in memory.changes() if c.key == "counter"}) == 4


def test_killed_subscriber_resumes_with_every_change_exactly_once(
        env: dict[str, str], client: redis.Redis, key_prefix: str, procs: list[subprocess.Popen[str]]) -> None:
    scope = f"sub-{uuid.uuid4().hex[:6]}"
    out = f"{key_prefix}:out"
    memory = Memory(scope, redis=client, keys=Keys(prefix=key_prefix))
    total = 300

    first = spawn(procs, env, "subscriber", scope, out, "auditor")
    wait_for(lambda: client.exists(f"{out}:ready:{first.pid}"), 30)
    writer = spawn(procs, env, "writer", scope, str(total), "0.003")
    wait_for(lambda: client.llen(out) >= 60, 30)
    first.kill()  # SIGKILL, mid-stream: no cleanup runs
    first.wait(10)
    at_kill = client.llen(out)
    assert at_kill < total and writer.poll() is None

    second = spawn(procs, env, "subscriber", scope, out, "auditor")
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    wait_for(lambda: memory.cursor("auditor") == total, 30)
    assert second.poll() is None
    expected = [f"{v}:item:{v:04d}:{v}" for v in range(1, total + 1)]
    assert [x.decode() for x in client.lrange(out, 0, -1)] == expected


def test_blocking_read_in_one_process_is_woken_by_a_write_in_another(
        env: dict[str, str], client: redis.Redis, key_prefix: str, procs: list[subprocess.Popen[str]]) -> None:
    scope = f"wait-{uuid.uuid4().hex[:6]}"
    memory = Memory(scope, redis=client, keys=Keys(prefix=key_prefix))
    reader = spawn(procs, env, "waiter", scope, "answer", "30")
    wait_for(lambda: numsub(client, memory.keys_layout.memory_channel(scope)) == 1, 30)  # its listener is subscribed
    memory["answer"] = {"total": 42}
    out, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    assert json.loads(out) == {"value": {"total": 42}}


def test_blocking_read_times_out_in_another_process(
        env: dict[str, str], procs: list[subprocess.Popen[str]]) -> None:
    reader = spawn(procs, env, "waiter", f"wait-{uuid.uuid4().hex[:6]}", "never", "0.3")
    out, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    assert json.loads(out) == {"error": "Timeout waiting for :never after 0.3 seconds"}


def test_subscription_survives_a_dropped_pubsub_connection(client: redis.Redis, key_prefix: str) -> None:
    scope = f"drop-{uuid.uuid4().hex[:6]}"
    keys = Keys(prefix=key_prefix)
    subscriber = Memory(scope, redis=client, keys=keys, poll_interval=0.2)
    writer = Memory(scope, redis=redis.Redis(connection_pool=client.connection_pool), keys=keys)
    got: list[Any] = []
    try:
        subscriber.subscribe("k", lambda c: got.append(c.value))
        for i in range(5):
            writer["k"] = i
        wait_for(lambda: len(got) == 5, 10)
        listener = subscriber._listener
        assert listener is not None and listener._pubsub is not None
        dropped = listener._pubsub.connection._sock
        dropped.shutdown(socket.SHUT_RDWR)  # the network drops
        for i in range(5, 10):
            writer["k"] = i  # published while the subscriber is reconnecting
        wait_for(lambda: len(got) == 10, 10)
        pubsub = listener._pubsub
        assert pubsub is not None and pubsub.connection._sock is not dropped  # it did reconnect
        writer["k"] = 10
        wait_for(lambda: len(got) == 11, 10)
        assert got == list(range(11))
    finally:
        subscriber.close()
