"""Memory benchmark: cross-process wake-up latency and set throughput, each beside its raw
redis-py baseline, in one run.

    .venv/bin/python bench/memory.py [--url redis://127.0.0.1:6379/0] [--trials 1000] [--sets 20000]

Wake-up: this process blocks in ``memory.get(k, wait=5)``; a second process (this script
with ``--child``) sets ``k`` to its monotonic clock (system-wide on Linux), so the reader
measures set-call -> get-returns. The baseline is the same dance with a raw redis-py
``PUBLISH`` and a ``PubSub.get_message`` reader. The writer waits 2 ms after the reader's
"ready" signal, so the reader is really blocked when the write lands.

Throughput: sequential ``memory.set`` against sequential raw ``HSET`` of the same JSON.
Uses a unique key prefix on the given server and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from robot_lab.keys import Keys  # noqa: E402
from robot_lab.memory.store import Memory  # noqa: E402

WRITER_DELAY = 0.002


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def child(args: argparse.Namespace) -> None:
    """The writing process: wait for the reader's signal, pause, write a timestamp."""
    client = redis.Redis.from_url(args.url)
    ready = f"{args.prefix}:ready:{args.child}"
    memory = Memory(args.scope, redis=client, keys=Keys(prefix=args.prefix))
    channel = f"{args.prefix}:raw-channel"
    for i in range(args.trials):
        client.blpop([ready], timeout=30)
        time.sleep(WRITER_DELAY)
        if args.child == "memory":
            memory.set(f"k{i}", time.monotonic_ns())
        else:
            client.publish(channel, str(time.monotonic_ns()))


def spawn_child(kind: str, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--child", kind, "--url", args.url, "--prefix", args.prefix,
                             "--scope", args.scope, "--trials", str(args.trials)])


def wake_memory(args: argparse.Namespace, client: redis.Redis) -> list[float]:
    memory = Memory(args.scope, redis=client, keys=Keys(prefix=args.prefix))
    memory._ensure_listener()
    proc = spawn_child("memory", args)
    ready = f"{args.prefix}:ready:memory"
    latencies = []
    try:
        for i in range(args.trials):
            client.rpush(ready, i)
            sent = memory.get(f"k{i}", wait=5)
            latencies.append((time.monotonic_ns() - sent) / 1e6)
    finally:
        proc.wait(30)
        memory.close()
    return latencies


def wake_raw(args: argparse.Namespace, client: redis.Redis) -> list[float]:
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(f"{args.prefix}:raw-channel")
    while pubsub.get_message(timeout=0.1) is None and not pubsub.subscribed:
        pass
    proc = spawn_child("raw", args)
    ready = f"{args.prefix}:ready:raw"
    latencies = []
    try:
        for i in range(args.trials):
            client.rpush(ready, i)
            message = None
            while message is None:
                message = pubsub.get_message(timeout=5)
            latencies.append((time.monotonic_ns() - int(message["data"])) / 1e6)
    finally:
        proc.wait(30)
        pubsub.close()
    return latencies


def throughput(args: argparse.Namespace, client: redis.Redis) -> tuple[float, float]:
    memory = Memory(f"{args.scope}-tp", redis=client, keys=Keys(prefix=args.prefix),
                    changes_maxlen=10_000)
    raw_hash = f"{args.prefix}:raw-hash"
    encode = msgspec.json.encode
    n = args.sets
    for i in range(200):  # warm up both paths (script load, connections)
        memory.set(f"k{i % 100}", {"i": i})
        client.hset(raw_hash, f"k{i % 100}", encode({"i": i}))
    start = time.perf_counter()
    for i in range(n):
        client.hset(raw_hash, f"k{i % 100}", encode({"i": i}))
    raw_rate = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(n):
        memory.set(f"k{i % 100}", {"i": i})
    mem_rate = n / (time.perf_counter() - start)
    return raw_rate, mem_rate


def report(name: str, values: list[float]) -> tuple[float, float]:
    p50, p99 = statistics.median(values), percentile(values, 99)
    print(f"  {name:<34} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   max {max(values):7.3f} ms   (n={len(values)})")
    return p50, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sets", type=int, default=20_000)
    parser.add_argument("--prefix", default=f"rlbench-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--scope", default="bench")
    parser.add_argument("--child", choices=["memory", "raw"])
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    client = redis.Redis.from_url(args.url)
    info = client.info("server")
    print(f"robot-lab memory benchmark: Redis {info.get('redis_version')} at {args.url}, "
          f"python {sys.version.split()[0]}, redis-py {redis.__version__}")
    try:
        print(f"\ncross-process wake-up ({args.trials} trials, writer pauses {WRITER_DELAY * 1e3:.0f} ms "
              "after the reader blocks):")
        raw_p50, raw_p99 = report("raw redis-py PUBLISH -> get_message", wake_raw(args, client))
        mem_p50, mem_p99 = report("Memory.set -> Memory.get(wait=5)", wake_memory(args, client))
        print(f"  ratio memory/raw: p50 {mem_p50 / raw_p50:.2f}x, p99 {mem_p99 / raw_p99:.2f}x   "
              f"target p99 < 5 ms: {'PASS' if mem_p99 < 5 else 'FAIL'}")

        raw_rate, mem_rate = throughput(args, client)
        print(f"\nset throughput ({args.sets} sequential writes, one client):")
        print(f"  {'raw HSET':<34} {raw_rate:9,.0f} ops/s   {1e6 / raw_rate:6.1f} us/op")
        print(f"  {'Memory.set (one Lua script)':<34} {mem_rate:9,.0f} ops/s   {1e6 / mem_rate:6.1f} us/op"
              "   (HGET previous + HSET + INCR version + XADD change + PUBLISH)")
        ratio = mem_rate / raw_rate
        print(f"  ratio memory/raw: {ratio:.2f}x   target >= 0.3x: {'PASS' if ratio >= 0.3 else 'FAIL'}")
    finally:
        keys = list(client.scan_iter(match=f"{args.prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


if __name__ == "__main__":
    main()
