"""Subprocess roles for tests/test_memory_procs.py (and bench/memory.py).

Run as ``python -m tests.memory_proc <role> <scope> [args...]`` with ``REDIS_URL`` and
``ROBOT_LAB_KEY_PREFIX`` in the environment; each role is a real, separate process.
"""

from __future__ import annotations

import json
import os
import sys
import time

from robot_lab.connection import connect
from robot_lab.errors import AwaitTimeout
from robot_lab.memory.store import Memory


def _memory(scope: str) -> Memory:
    return Memory(scope, redis=connect(os.environ["REDIS_URL"]), writer=f"pid-{os.getpid()}")


def counter(scope: str, increments: str) -> None:
    """Wait for ``go`` (a cross-process wake-up), then increment ``counter`` N times."""
    memory = _memory(scope)
    memory.get("go", wait=60)
    for _ in range(int(increments)):
        memory.update("counter", lambda v: (v or 0) + 1)
    memory.close()


def subscriber(scope: str, out_key: str, subscriber_id: str) -> None:
    """Durable, transactional subscriber: appends ``version:key:value`` per change to a list."""
    memory = _memory(scope)

    def record(change, pipe):  # type: ignore[no-untyped-def]
        pipe.rpush(out_key, f"{change.version}:{change.key}:{change.value}")

    memory.subscribe_pattern("item:*", record, subscriber_id=subscriber_id, transactional=True)
    memory.redis.set(f"{out_key}:ready:{os.getpid()}", 1)
    while True:  # killed by the test
        time.sleep(1)


def writer(scope: str, count: str, delay: str) -> None:
    memory = _memory(scope)
    for i in range(1, int(count) + 1):
        memory[f"item:{i:04d}"] = i
        time.sleep(float(delay))


def waiter(scope: str, key: str, timeout: str) -> None:
    """Block on ``key`` and print what happened as one JSON line."""
    memory = _memory(scope)
    try:
        value = memory.get(key, wait=float(timeout))
        print(json.dumps({"value": value}), flush=True)
    except AwaitTimeout as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
    finally:
        memory.close()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    {"counter": counter, "subscriber": subscriber, "writer": writer, "waiter": waiter}[role](*args)
