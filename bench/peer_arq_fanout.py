"""The peer side of ``bench/concurrency.py --peer-python``: the same fan-out on arq.

Run by an interpreter that has arq installed (arq pins redis-py < 6, so it lives in a venv of
its own: ``python3 -m venv /tmp/peer && /tmp/peer/bin/pip install arq``):
``/tmp/peer/bin/python bench/peer_arq_fanout.py --url redis://... --count 1000 --sleep-ms 400``.

One arq worker process (``max_jobs = --count``: every job in flight at once, on asyncio;
``poll_delay = --poll-delay``, 10 ms unless told: arq at its fastest, not its 0.5 s default) runs
``--count`` jobs whose body is ``asyncio.sleep(--sleep-ms)`` -- nothing else: no model call
record, no result transition, no run state. The jobs are enqueued one ``enqueue_job`` after
another (arq's API: one job per call, each a round trip), then this process waits for every
result key. Prints one JSON line: wall (first enqueue to last result), the enqueue time, the
worker's CPU seconds and peak RSS during the phase, jobs done. Imports nothing of robot-lab.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

WORKER = r"""
import asyncio, os, sys
from arq.connections import RedisSettings
from arq.worker import run_worker

SLEEP = int(os.environ["PEER_SLEEP_MS"]) / 1000

async def sleepy(ctx, i):
    await asyncio.sleep(SLEEP)
    return i

class WorkerSettings:
    functions = [sleepy]
    redis_settings = RedisSettings.from_dsn(os.environ["PEER_URL"])
    queue_name = os.environ["PEER_QUEUE"]
    max_jobs = int(os.environ["PEER_MAX_JOBS"])
    health_check_interval = 1
    poll_delay = float(os.environ["PEER_POLL_DELAY"])
    keep_result = 600

run_worker(WorkerSettings)
"""


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


async def fan_out(url: str, queue: str, count: int, pid: int, sleep: float) -> dict[str, float]:
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(url), default_queue_name=queue)
    deadline = time.monotonic() + 120
    while not await pool.exists(queue + ":health-check"):  # the worker is up
        if time.monotonic() > deadline:
            raise SystemExit("arq worker did not start")
        await asyncio.sleep(0.1)
    warm = [await pool.enqueue_job("sleepy", -1 - i) for i in range(min(count, 20))]
    for job in warm:
        await job.result(timeout=60)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS from here on
    cpu = _proc_cpu(pid)
    start = time.perf_counter()
    jobs = [await pool.enqueue_job("sleepy", i) for i in range(count)]
    published = time.perf_counter() - start
    keys = [f"arq:result:{job.job_id}" for job in jobs]
    done = 0
    while time.perf_counter() - start < 600:
        done = await pool.exists(*keys)
        if done >= count:
            break
        await asyncio.sleep(0.02)
    wall = time.perf_counter() - start
    figures = {"wall": wall, "published": published, "done": done, "worker_cpu": _proc_cpu(pid) - cpu,
               "peak_rss": _proc_status(pid, "VmHWM"), "ideal": sleep + published}
    await pool.delete(*keys)
    await pool.aclose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--sleep-ms", type=int, default=400)
    parser.add_argument("--poll-delay", type=float, default=0.01,
                        help="arq's poll_delay: seconds between its queue reads (arq's default 0.5 s adds up to "
                             "half a second to a fan-out's wall; 0.01 is its best here)")
    args = parser.parse_args()
    queue = f"bench-arq-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PEER_URL=args.url, PEER_QUEUE=queue, PEER_SLEEP_MS=str(args.sleep_ms),
               PEER_POLL_DELAY=str(args.poll_delay),
               PEER_MAX_JOBS=str(args.count))
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        figures = asyncio.run(fan_out(args.url, queue, args.count, worker.pid, args.sleep_ms / 1000))
    finally:
        worker.terminate()
        worker.wait(60)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
