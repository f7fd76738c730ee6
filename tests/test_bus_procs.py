"""The bus across real processes on a real Redis: two workers share an inbox, a worker is
killed with SIGKILL, conversations stay ordered, requests cross processes, and a message
published by the real ``redis-cli`` binary gets a reply."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from robot_lab.bus import Bus
from robot_lab.errors import AwaitTimeout
from robot_lab.keys import Keys
from robot_lab.schemas import decode_message
from tests.hardened import child_pythonpath
from tests.redis_server import REPO_ROOT, wait_for
from tests.stopping import stopped

pytestmark = pytest.mark.slow

VISIBILITY = 0.6


@pytest.fixture
def env(real_redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Environment for worker subprocesses and this process: same Redis, same prefix."""
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("ROBOT_LAB_BUS__VISIBILITY_TIMEOUT", str(VISIBILITY))
    from robot_lab import connection

    monkeypatch.setattr(connection, "_clients", {})
    child = dict(os.environ)
    child.update(
        REDIS_URL=real_redis_url,
        ROBOT_LAB_KEY_PREFIX=key_prefix,
        ROBOT_LAB_BUS__VISIBILITY_TIMEOUT=str(VISIBILITY),
        ROBOT_LAB_LOG_LEVEL="WARNING",
        PYTHONPATH=child_pythonpath(),
        BUSPROC_RECORD_URL=real_redis_url,
    )
    yield child
    client = redis_lib.Redis.from_url(real_redis_url)
    keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started subprocesses, always killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def spawn(procs: list, env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:  # type: ignore[type-arg]
    log = open(tmp_path / f"{'-'.join(args)}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "tests.busproc", *args], cwd=REPO_ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def start_workers(procs: list, env: dict[str, str], tmp_path: Path, mode: str, robot: str, *consumers: str) -> Bus:  # type: ignore[type-arg]
    bus = Bus()
    for consumer in consumers:
        spawn(procs, env, tmp_path, "worker", mode, robot, consumer)
    prefix = bus.keys.prefix
    wait_for(lambda: all(bus.redis.exists(f"{prefix}:test:ready:{c}") for c in consumers), timeout=30)
    return bus


def test_two_worker_processes_handle_2000_messages_exactly_once(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bus = start_workers(procs, env, tmp_path, "record", "shared", "w1", "w2")
    publisher = spawn(procs, env, tmp_path, "publish", "shared", "2000")
    assert publisher.wait(60) == 0
    test = f"{bus.keys.prefix}:test"
    wait_for(lambda: bus.redis.hlen(f"{test}:seen") == 2000, timeout=60)
    inbox = bus.keys.inbox("shared")
    wait_for(lambda: bus.redis.xpending(inbox, "shared")["pending"] == 0, timeout=30)
    counts = bus.redis.hgetall(f"{test}:seen")
    assert len(counts) == 2000 and set(counts.values()) == {b"1"}  # none lost, none twice
    published = {decode_message(f[b"envelope"]).id for _, f in bus.redis.xrange(inbox)}
    assert published == {k.decode() for k in counts}
    by = {k.decode(): int(v) for k, v in bus.redis.hgetall(f"{test}:by").items()}
    assert set(by) == {"w1", "w2"} and sum(by.values()) == 2000
    assert bus.dlq_size("shared") == 0


def test_killed_consumer_entries_are_reclaimed_and_it_ends_with_nothing_pending(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bus = Bus()
    bus.register("jobs")
    sent = [bus.publish("jobs", f"job{i}").id for i in range(10)]  # all there before it reads
    start_workers(procs, env, tmp_path, "slow", "jobs", "doomed")
    doomed = procs[-1]
    inbox = bus.keys.inbox("jobs")
    test = f"{bus.keys.prefix}:test"
    wait_for(lambda: bus.redis.llen(f"{test}:started") == 1, timeout=30)
    held = lambda: len(bus.redis.xpending_range(inbox, "jobs", "-", "+", 100, consumername="doomed"))  # noqa: E731
    wait_for(lambda: held() == 10)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    start_workers(procs, env, tmp_path, "record", "jobs", "rescuer")
    wait_for(lambda: bus.redis.hlen(f"{test}:seen") == 10, timeout=30)
    counts = {k.decode(): int(v) for k, v in bus.redis.hgetall(f"{test}:seen").items()}
    assert counts == {i: 1 for i in sent}
    wait_for(lambda: bus.redis.xpending(inbox, "jobs")["pending"] == 0)
    consumers = {c["name"].decode(): c["pending"] for c in bus.redis.xinfo_consumers(inbox, "jobs")}
    assert consumers.get("doomed", 0) == 0
    wait_for(lambda: "doomed" not in {c["name"].decode() for c in bus.redis.xinfo_consumers(inbox, "jobs")},
             timeout=10)


def publish_conversations_and_check_order(bus: Bus, procs: list, env: dict[str, str], tmp_path: Path,  # type: ignore[type-arg]
                                          n_conv: int, per_conv: int) -> str:
    """Publish ``per_conv`` messages on each of ``n_conv`` conversations (interleaved) to
    ``chat``; wait until all are handled; check each conversation was handled in order and
    never two of its messages at once. Returns the test's key prefix."""
    publisher = spawn(procs, env, tmp_path, "publish", "chat", str(n_conv * per_conv), str(n_conv))
    assert publisher.wait(60) == 0
    test = f"{bus.keys.prefix}:test"
    total = lambda: sum(bus.redis.llen(f"{test}:order:c{c}") for c in range(n_conv))  # noqa: E731
    wait_for(lambda: total() == n_conv * per_conv, timeout=60)
    for c in range(n_conv):
        assert [int(x) for x in bus.redis.lrange(f"{test}:order:c{c}", 0, -1)] == list(range(per_conv))
    assert bus.redis.lrange(f"{test}:overlap", 0, -1) == []
    return test


def test_conversation_order_holds_across_two_worker_processes(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bus = start_workers(procs, env, tmp_path, "order", "chat", "o1", "o2")
    test = publish_conversations_and_check_order(bus, procs, env, tmp_path, 6, 30)
    by = {k.decode(): int(v) for k, v in bus.redis.hgetall(f"{test}:by").items()}
    assert set(by) == {"o1", "o2"}  # both processes took part


def test_request_round_trip_across_processes_and_timeout(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bus = start_workers(procs, env, tmp_path, "echo", "echo", "e1")
    reply = bus.request("echo", "across processes", timeout=20, conversation_id="x1")
    assert reply.content == "echo: across processes" and reply.from_ == "echo"
    assert reply.conversation_id == "x1"
    procs[-1].send_signal(signal.SIGTERM)  # graceful stop
    assert stopped(procs[-1]) == 0
    with pytest.raises(AwaitTimeout, match=r"'echo' within 0.5 s"):
        bus.request("echo", "anyone?", timeout=0.5)


@pytest.mark.not_hardened(reason="an unsigned envelope written with redis-cli is refused under signing.verify=require "
                                  "by design; the signed shell recipe is tests/test_security_signing.py's")
def test_redis_cli_publish_gets_a_reply(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cli = shutil.which("redis-cli") or ("/usr/bin/redis-cli" if os.path.exists("/usr/bin/redis-cli") else None)
    if cli is None:
        pytest.skip("redis-cli binary not installed")
    bus = start_workers(procs, env, tmp_path, "echo", "billing", "b1")
    url = env["REDIS_URL"]
    inbox, reply_stream = Keys(bus.keys.prefix).inbox("billing"), Keys(bus.keys.prefix).inbox("cli-client")
    envelope = json.dumps({"v": 1, "id": "cli-0001", "to": "billing", "from": "cli-client",
                           "reply_to": "cli-client", "content": "hello from redis-cli"})
    out = subprocess.run([cli, "-u", url, "XADD", inbox, "*", "envelope", envelope],
                         capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout.strip()  # the entry id
    read = subprocess.run([cli, "-u", url, "--no-raw", "XREAD", "BLOCK", "15000", "STREAMS", reply_stream, "0-0"],
                          capture_output=True, text=True, timeout=30, check=True)
    assert "echo: hello from redis-cli" in read.stdout
    [(_, fields)] = bus.redis.xrange(reply_stream)
    reply = decode_message(fields[b"envelope"])
    assert reply.in_reply_to == "cli-0001" and reply.kind == "reply" and reply.content == "echo: hello from redis-cli"
