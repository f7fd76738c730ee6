"""Run retention: what a finished network run leaves in Redis, with robot-lab's retention
(run memory expires with the run, the ``runs`` index is trimmed) beside the same runs with
retention switched off (what ``RunStore.finish_housekeeping`` did before: run keys only).

    .venv/bin/python bench/run_retention.py [--url redis://127.0.0.1:6379/0] [--runs 50]

Each run is a 3-task network whose tasks store their reply in run memory (``memory_key``),
run by in-process rq workers on the given server (fakeredis without ``--url``). Printed per
finished run: keys left, keys left without a TTL (they would stay forever), and their bytes
(``MEMORY USAGE``, real Redis only); then the same after the TTLs passed, simulated by
deleting every key that has one. Uses a unique key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _network(name: str) -> Any:
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    bot = build(f"keeper-{name}", model="scripted/echo")
    net = create_network(name)
    net.task("a", bot, memory_key="a")
    net.task("b", bot, memory_key="b")
    net.task("c", bot, depends_on=["a", "b"], memory_key="c")
    return net


def _census(client: Any, prefix: str, real: bool) -> tuple[int, int, int]:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.ttl(key)
    forever = [k for k, ttl in zip(keys, pipe.execute()) if ttl == -1]
    size = sum(int(client.memory_usage(k) or 0) for k in forever) if real else 0
    return len(keys), len(forever), size


def _scenario(client: Any, runs: int, retention: bool, real: bool) -> dict[str, float]:
    from robot_lab.network import run_state
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.embedded import EmbeddedWorkers
    from robot_lab.settings import reload_settings

    prefix = f"bench-ret-{uuid.uuid4().hex[:8]}"
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    reload_settings()
    saved = run_state.expire_finished_run
    if not retention:
        run_state.expire_finished_run = lambda *a, **k: None
    try:
        name = f"ret-{uuid.uuid4().hex[:6]}"
        with EmbeddedWorkers(client, [f"keeper-{name}"], threads=2):
            coordinator = Coordinator(connection=client)
            for i in range(runs):
                assert coordinator.submit(_network(name), f"run {i}").wait(timeout=60).status == "completed"
        total, forever, size = _census(client, prefix, real)
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):  # the TTLs pass
            if client.ttl(key) != -1:
                client.delete(key)
        after_total, after_forever, after_size = _census(client, prefix, real)
    finally:
        run_state.expire_finished_run = saved
        leftover = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if leftover:
            client.delete(*leftover)
    return {"keys": total / runs, "forever": forever / runs, "bytes": size / runs,
            "after_keys": after_total / runs, "after_bytes": after_size / runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    if args.url:
        import redis

        client: Any = redis.Redis.from_url(args.url)
    else:
        import fakeredis

        client = fakeredis.FakeRedis()
    real = bool(args.url)
    old = _scenario(client, args.runs, retention=False, real=real)
    new = _scenario(client, args.runs, retention=True, real=real)
    print(f"{args.runs} finished runs, 3 tasks each, run memory written ({'real Redis' if real else 'fakeredis'})")
    print(f"{'':34}{'without retention':>20}{'robot-lab':>12}")
    for label, key in [("keys per run, just finished", "keys"), ("  of them without a TTL", "forever"),
                       ("keys per run after the TTLs", "after_keys"), ("bytes per run after the TTLs", "after_bytes")]:
        print(f"{label:34}{old[key]:>20.2f}{new[key]:>12.2f}")
    if old["after_keys"]:
        print(f"ratio (keys left per run after the TTLs, robot-lab / without): {new['after_keys'] / old['after_keys']:.3f}")


if __name__ == "__main__":
    main()
