"""Subprocess entry points for the multi-process bus tests (tests/test_bus_procs.py).

    python -m tests.busproc worker MODE ROBOT CONSUMER
    python -m tests.busproc publish ROBOT COUNT [CONVERSATIONS]

Configuration comes from the environment the test sets: REDIS_URL, ROBOT_LAB_KEY_PREFIX,
ROBOT_LAB_BUS__* (visibility timeout, batch size), BUSPROC_IN_FLIGHT (handlers at once, 1). Every side effect a handler has is
recorded in Redis under ``<prefix>:test:*`` so the test can check it from outside, through
BUSPROC_RECORD_URL when set: the test's own connection, apart from the bus's, whose Redis
user in the hardened profile (tests/hardened.py) may write only the robot's keys.

Worker modes:
  record  count each message id (HINCRBY) and who handled it
  slow    record that handling started, then hang (to be killed with pending entries)
  order   append each message's sequence number to its conversation's list and flag any
          overlap of two handlers of one conversation
  echo    respond_to_tasks: reply "echo: <content>"
  convecho  respond_to_tasks: append the message's sequence number to its conversation's
          list, then reply "re: <seq>"
  spans   like order, and record each handler's start and end time (``conv|start|end`` in
          ``spans:<consumer>``) so a test can see handlers of one process overlap
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _prefix() -> str:
    from robot_lab.settings import get_settings

    return get_settings().key_prefix


def worker(mode: str, robot: str, consumer: str) -> None:
    import redis

    from robot_lab.bus import BusPoller
    from robot_lab.connection import get_redis

    r = redis.Redis.from_url(os.environ["BUSPROC_RECORD_URL"]) if os.environ.get("BUSPROC_RECORD_URL") else get_redis()
    test = f"{_prefix()}:test"
    poller = BusPoller(robot, consumer=consumer, block_ms=200, in_flight=int(os.environ.get("BUSPROC_IN_FLIGHT", "1")))

    if mode == "record":
        def handle(msg):  # type: ignore[no-untyped-def]
            pipe = r.pipeline(transaction=False)
            pipe.hincrby(f"{test}:seen", msg.id, 1)
            pipe.hincrby(f"{test}:by", consumer, 1)
            pipe.execute()

        poller.on_message(handle)
    elif mode == "slow":
        def hang(msg):  # type: ignore[no-untyped-def]
            r.rpush(f"{test}:started", msg.id)
            time.sleep(3600)

        poller.on_message(hang)
    elif mode == "order":
        def ordered(msg):  # type: ignore[no-untyped-def]
            conv = msg.conversation_id
            if not r.set(f"{test}:busy:{conv}", consumer, nx=True, px=10_000):
                r.rpush(f"{test}:overlap", f"{conv}:{msg.content['seq']}")
            time.sleep(0.001 * (msg.content["seq"] % 3))
            r.rpush(f"{test}:order:{conv}", msg.content["seq"])
            r.hincrby(f"{test}:by", consumer, 1)
            r.delete(f"{test}:busy:{conv}")

        poller.on_message(ordered)
    elif mode == "spans":
        def spans(msg):  # type: ignore[no-untyped-def]
            conv = msg.conversation_id
            if not r.set(f"{test}:busy:{conv}", consumer, nx=True, px=10_000):
                r.rpush(f"{test}:overlap", f"{conv}:{msg.content['seq']}")
            start = time.time()
            time.sleep(0.05)
            r.rpush(f"{test}:order:{conv}", msg.content["seq"])
            r.delete(f"{test}:busy:{conv}")
            r.rpush(f"{test}:spans:{consumer}", f"{conv}|{start}|{time.time()}")

        poller.on_message(spans)
    elif mode == "echo":
        poller.respond_to_tasks(lambda msg: f"echo: {msg.content}")
    elif mode == "convecho":
        def convecho(msg):  # type: ignore[no-untyped-def]
            r.rpush(f"{test}:order:{msg.conversation_id}", f"{consumer}:{msg.content['seq']}")
            return f"re: {msg.content['seq']}"

        poller.respond_to_tasks(convecho)
    else:
        raise SystemExit(f"unknown mode {mode!r}")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    poller.bus.register(robot)
    r.set(f"{test}:ready:{consumer}", 1)
    poller.run_forever(stop)


def publish(robot: str, count: int, conversations: int = 0) -> None:
    from robot_lab.bus import Bus

    bus = Bus()
    for i in range(count):
        if conversations:
            conv = f"c{i % conversations}"
            bus.publish(robot, {"seq": i // conversations}, conversation_id=conv)
        else:
            bus.publish(robot, f"m{i}")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "worker":
        worker(*args)
    elif cmd == "publish":
        publish(args[0], int(args[1]), int(args[2]) if len(args) > 2 else 0)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
