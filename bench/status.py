"""Status benchmark: what `robot-lab status --json` costs against Redis, beside the minimal
raw redis-py reads a hand-written dashboard would do (one pipeline of LLEN + ZCARD x2 + XLEN
+ XINFO GROUPS + XLEN dlq per robot, HGETALL of each active run's state), in one run.

    .venv/bin/python bench/status.py [--url redis://127.0.0.1:6379/0] [--robots 7] [--runs 20] [--rounds 20]

Setup: N robots with a bus inbox (100 entries, consumer group), M active runs of a 7-task
network queued on their rq queues, one live heartbeat per robot. Each round reads the whole
status; the median round time is reported. Also the heartbeat's own cost: one beat (SET PX +
ZADD in one pipeline, plus the local file). Unique key prefix; cleaned up afterwards
(including the rq queues it made).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from robot_lab.bus import Bus  # noqa: E402
from robot_lab.keys import Keys  # noqa: E402
from robot_lab.network.coordinator import Coordinator  # noqa: E402
from robot_lab.network.dsl import create_network  # noqa: E402
from robot_lab.runtime.robot import build  # noqa: E402
from robot_lab.workers.health import WorkerHeartbeat  # noqa: E402
from robot_lab.workers.fleet_status import collect_status  # noqa: E402


def raw_status(r: redis.Redis, keys: Keys, robots: list[str]) -> dict:
    pipe = r.pipeline(transaction=False)
    for robot in robots:
        pipe.llen(f"rq:queue:robot:{robot}")
        pipe.zcard(f"rq:wip:robot:{robot}")
        pipe.zcard(f"rq:failed:robot:{robot}")
        pipe.xlen(keys.inbox(robot))
        pipe.xinfo_groups(keys.inbox(robot))
        pipe.xlen(keys.dlq(robot))
    pipe.smembers(keys.runs_active())
    out = pipe.execute()
    runs = out[-1]
    pipe = r.pipeline(transaction=False)
    for run_id in runs:
        pipe.hgetall(keys.run(run_id.decode()) + ":state")
    return {"robots": out[:-1], "runs": pipe.execute()}


def timed(fn, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--robots", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    r = redis.Redis.from_url(args.url, protocol=2)
    prefix = f"bench-status-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    robots = [f"{prefix}-r{i}" for i in range(args.robots)]
    try:
        bus = Bus(redis=r, keys=keys)
        for robot in robots:
            bus.register(robot)
            for i in range(100):
                bus.publish(robot, f"message {i}")
        net = create_network("bench")
        for i in range(7):
            net.task(f"t{i}", build(robots[i % len(robots)], model="scripted/echo"))
        coordinator = Coordinator(connection=r, keys=keys)
        for _ in range(args.runs):
            coordinator.submit(net, "hi")
        with tempfile.TemporaryDirectory() as tmp:
            beats = [WorkerHeartbeat(r, keys, f"{robot}-w", [robot], role="worker", interval=60,
                                     directory=Path(tmp)) for robot in robots]
            for beat in beats:
                beat.beat()
            raw = timed(lambda: raw_status(r, keys, robots), args.rounds)
            ours = timed(lambda: collect_status(r, keys), args.rounds)
            beat_cost = timed(beats[0].beat, args.rounds * 5)
        print(f"setup: {args.robots} robots, {args.runs} active runs x 7 tasks, 100 inbox entries per robot")
        print(f"raw redis-py status reads      {raw * 1000:8.2f} ms")
        print(f"robot-lab collect_status       {ours * 1000:8.2f} ms")
        print(f"ratio robot-lab / raw          {ours / raw:8.2f}x")
        print(f"one heartbeat (SET+ZADD+file)  {beat_cost * 1000:8.2f} ms (every {5} s per worker by default)")
    finally:
        from rq import Queue

        for robot in robots:
            Queue(f"robot:{robot}", connection=r).delete(delete_jobs=True)
        for key in r.scan_iter(match=f"{prefix}*", count=1000):
            r.delete(key)


if __name__ == "__main__":
    main()
