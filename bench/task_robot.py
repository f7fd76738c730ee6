"""Micro-benchmark: the CPU of a network task's robot part, in one process, without rq's worker.

Run: ``.venv/bin/python bench/task_robot.py [--count 500] [--rounds 3] [--threads 1] [--profile FILE]``
(uses ``--url`` / REDIS_URL, else starts a private redis-server; a unique key prefix; cleans up
after).

Submits a fan-out network of ``--count`` tasks on a robot whose scripted model answers at once
(``scripted/sleep:0``), then runs each task's rq job function (``run_task``) in this process --
claim, robot, result, as ``robot-lab worker`` does, minus rq's job lifecycle -- and prints the
CPU per task of the whole job and of its robot part (``_run_task_hooks``: the task hooks, the
robot's run with its step journal, memory and rails). ``--threads N`` runs the jobs on N threads
at once (GIL contention, a fuller connection pool), as an in-flight worker does.
``bench/concurrency.py --only network`` is the end-to-end figure this stands in for; this one
is for iterating on the robot part's Python overhead (issue 30, item 1).

Each round also prints the cyclic GC's collections (gen0/gen1/gen2) and the CPU they took.
This process keeps CPython's defaults; ``--gc-freeze --gc-threshold 4000,10,10`` does what
``robot-lab worker`` does once warm (``tune_gc`` in robot_lab/workers/inflight.py). A network
task's Robot and Memory objects make no reference cycles (tests/test_freed_without_gc.py), so
they are freed when the task ends, not at the next (rarer, once tuned) collection.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_server import RedisServer  # noqa: E402  (the suite's private server)

os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
os.environ.setdefault("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")


def jobs_of(client, robot: str) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """The queued jobs' arguments (prefix, run id, task, job id); they stay queued (no
    worker serves the queue) so that a sweep does not take them for lost."""
    from rq import Queue
    from rq.job import Job

    from robot_lab.network.serializer import JobSerializer
    from robot_lab.rq_connection import rq_connection

    connection = rq_connection(client)
    queue = Queue(f"robot:{robot}", connection=connection, serializer=JobSerializer)
    ids = queue.get_job_ids()
    jobs = Job.fetch_many(ids, connection=connection, serializer=JobSerializer)
    return [list(job.args) for job in jobs if job is not None]


class GCTimer:
    """The CPU the cyclic GC takes (``gc.callbacks``; a collection runs in the thread that
    triggered it, holding the interpreter lock)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict) -> None:  # type: ignore[type-arg]
        now, me = time.thread_time(), threading.get_ident()
        if phase == "start":
            self._started[me] = now
        elif me in self._started:
            self.spent += now - self._started.pop(me)


def one_round(client, bot, count: int, threads: int) -> tuple[float, float, float, int, list[int], float]:  # type: ignore[no-untyped-def]
    """(job CPU, robot-part CPU, wall) for one fan-out of ``count`` tasks, how many ended ok,
    the cyclic GC's collections per generation meanwhile and the CPU they took."""
    import gc

    from robot_lab.network import task_job
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network

    net = create_network(f"fan{count}")
    with net.parallel("fan"):
        for i in range(count):
            net.task(f"t{i}", bot)
    handle = Coordinator(connection=client).submit(net, "go")
    jobs = jobs_of(client, bot.name)
    robot_cpu = [0.0]
    hooks = task_job._run_task_hooks
    lock = threading.Lock()

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.thread_time()
        try:
            return hooks(*args, **kwargs)
        finally:
            spent = time.thread_time() - t
            with lock:
                robot_cpu[0] += spent

    task_job._run_task_hooks = timed
    outcomes: list[dict] = []
    try:
        gc_before = [g["collections"] for g in gc.get_stats()]
        timer = GCTimer()
        gc.callbacks.append(timer)
        cpu, wall = time.process_time(), time.perf_counter()
        if threads <= 1:
            outcomes = [task_job.run_task(*args) for args in jobs]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                outcomes = list(pool.map(lambda a: task_job.run_task(*a), jobs))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        collections = [g["collections"] - b for g, b in zip(gc.get_stats(), gc_before)]
        gc.callbacks.remove(timer)
    finally:
        task_job._run_task_hooks = hooks
    handle.wait(timeout=60)
    from rq import Queue

    from robot_lab.network.serializer import JobSerializer
    from robot_lab.rq_connection import rq_connection

    Queue(f"robot:{bot.name}", connection=rq_connection(client), serializer=JobSerializer).empty()
    ok = sum(1 for o in outcomes if o.get("status") == "ok" and not o.get("failed"))
    return cpu, robot_cpu[0], wall, ok, collections, timer.spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", help="write a cProfile of the last round here")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after the warm-up round (as robot-lab worker's tune_gc)")
    parser.add_argument("--gc-threshold", help="gc.set_threshold(...) before the rounds, e.g. 4000,10,10")
    args = parser.parse_args()

    server = RedisServer()
    url = server.bench_url(args.url)
    prefix = f"bench-robot-{uuid.uuid4().hex[:8]}"
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    os.environ["REDIS_URL"] = url
    from robot_lab.connection import connect
    from robot_lab.keys import Keys
    from robot_lab.runtime.registry import publish_specs
    from robot_lab.runtime.robot import build
    from robot_lab.settings import reload_settings

    reload_settings()
    from robot_lab.network import task_job

    task_job._last_sweep = float("inf")  # no sweeps inside the measured jobs: not the robot part
    client = connect(url)
    bot = build(f"rob-{uuid.uuid4().hex[:6]}", model="scripted/sleep:0")
    publish_specs([bot.to_spec()], connection=client, keys=Keys(prefix=prefix))
    try:
        one_round(client, bot, min(args.count, 20), args.threads)  # warm: imports, caches, connections
        if args.gc_threshold:
            import gc

            gc.set_threshold(*(int(v) for v in args.gc_threshold.split(",")))
        if args.gc_freeze:
            import gc

            gc.collect()
            gc.freeze()
        for n in range(args.rounds):
            profiler = None
            if args.profile and n == args.rounds - 1:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            cpu, robot, wall, ok, collections, gc_cpu = one_round(client, bot, args.count, args.threads)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
            print(f"round {n + 1}: {ok}/{args.count} ok, job CPU {cpu / args.count * 1e6:6.0f} us/task, "
                  f"robot part {robot / args.count * 1e6:6.0f} us/task, wall {wall:.2f} s, "
                  f"GC runs {'/'.join(map(str, collections))} CPU {gc_cpu / args.count * 1e6:.0f} us/task "
                  f"(threads {args.threads}, load {os.getloadavg()[0]:.2f})")
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        server.stop()


if __name__ == "__main__":
    main()
