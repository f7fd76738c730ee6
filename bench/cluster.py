"""One Redis against a 3-primary Redis Cluster, same client processes: bus and DAG throughput.

    .venv/bin/python bench/cluster.py [--workers 3] [--robots 6] [--messages 3000] [--runs 4] [--tasks 10]

Starts its own servers on free loopback ports (tests/redis_cluster.py): one plain
``redis-server``, and six cluster nodes (3 primaries, 3 replicas). Both sides run the same
code with ``RQ_KEY_PREFIX={rq}`` (harmless on one Redis) and the same number of processes:

* bus: ``--workers`` publisher processes send ``--messages`` 200-byte messages spread over
  ``--robots`` inboxes (``Bus.publish``), then ``--workers`` consumer processes, each with
  one ``BusPoller`` thread per robot and a no-op handler, drain them. Publish and drain
  rates are msgs/s.
* DAG: ``--workers`` worker processes (robot-lab's rq loop) serve a ``--tasks``-task fan-out
  network; ``--runs`` runs are submitted at once; tasks/s from first submit to last finish
  (scripted model, so this is the runtime's own cost, not an LLM's).

Prints each figure for both sides and the ratio cluster / single, and how busy the Redis
servers were (CPU seconds used by all of a side's servers over that side's wall time: well
under one core means the clients, not Redis, set the ceiling).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

os.environ["RQ_KEY_PREFIX"] = "{rq}"  # before anything imports rq (both sides alike)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAYLOAD = "x" * 200


def _env(url: str, prefix: str) -> None:
    os.environ["REDIS_URL"] = url
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    from robot_lab.settings import reload_settings

    reload_settings()  # key prefix and cluster layout of this URL


def _publisher(url: str, prefix: str, robots: list[str], count: int, offset: int, ready: Any, go: Any) -> None:
    _env(url, prefix)
    from robot_lab.bus import Bus
    from robot_lab.connection import connect

    bus = Bus(connect(url))
    bus.redis.ping()
    ready.release()
    go.wait()  # process start-up is not the bus's cost
    for i in range(count):
        bus.publish(robots[(offset + i) % len(robots)], PAYLOAD)


def _consumer(url: str, prefix: str, robots: list[str], done: Any, stop: Any) -> None:
    _env(url, prefix)
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.connection import connect

    bus = Bus(connect(url))
    def handled(_message: Any) -> None:
        with done.get_lock():  # shared by every consumer process
            done.value += 1

    pollers = [BusPoller(r, bus, consumer=f"c{os.getpid()}", batch_size=32, block_ms=50).on_message(handled)
               for r in robots]
    for p in pollers:
        p.start()
    stop.wait()
    for p in pollers:
        p.stop()


def _stop_all(procs: list[Any]) -> None:
    for p in procs:
        p.terminate()
        p.join(10)


def _processes(target: Any, args_list: list[tuple[Any, ...]]) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args, daemon=True) for args in args_list]
    for p in procs:
        p.start()
    return procs


def bench_bus(url: str, workers: int, n_robots: int, messages: int) -> tuple[float, float]:
    from robot_lab.bus import Bus
    from robot_lab.connection import connect

    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    _env(url, prefix)
    bus = Bus(connect(url))
    robots = [f"bot{i}" for i in range(n_robots)]
    for r in robots:
        bus.register(r)
    per = messages // workers
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = _processes(_publisher, [(url, prefix, robots, per, i * per, ready, go) for i in range(workers)])
    for _ in procs:
        ready.acquire(timeout=300)
    started = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    publish_s = time.perf_counter() - started
    if any(p.exitcode for p in procs):
        raise SystemExit("a publisher failed")
    done, stop = ctx.Value("i", 0), ctx.Event()
    consumers = _processes(_consumer, [(url, prefix, robots, done, stop) for _ in range(workers)])
    # count from the first message handled: process start-up is not the bus's cost
    while done.value == 0:
        time.sleep(0.005)
    started, first = time.perf_counter(), done.value
    deadline = time.monotonic() + 600
    while done.value < per * workers:
        if time.monotonic() > deadline or not any(p.is_alive() for p in consumers):
            raise SystemExit(f"consumers stopped at {done.value} of {per * workers}")
        time.sleep(0.005)
    drain_s = time.perf_counter() - started
    stop.set()
    for p in consumers:
        p.join(10)
    return per * workers / publish_s, (per * workers - first) / drain_s


def _serve(url: str, prefix: str, queues: list[str]) -> None:
    _env(url, prefix)
    from robot_lab.workers.process import _rq_loop, warm_up

    warm_up()
    _rq_loop(url, queues, f"bench-{os.getpid()}", False)


def bench_dag(url: str, workers: int, runs: int, tasks: int) -> float:
    from rq import Queue, Worker

    from robot_lab.connection import connect
    from robot_lab.keys import default_keys
    from robot_lab.rq_connection import rq_connection
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    _env(url, prefix)
    connection = connect(url)
    bots = [build(f"dag{i}-{prefix}", model="scripted/text:ok") for i in range(3)]
    queues = [f"robot:{b.name}" for b in bots]
    procs = _processes(_serve, [(url, prefix, queues) for _ in range(workers)])
    try:
        rq = rq_connection(connection)
        deadline = time.time() + 180
        while len(Worker.all(queue=Queue(queues[0], connection=rq))) < workers:
            if time.time() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.1)
        coordinator = Coordinator(connection=connection, keys=default_keys())
        nets = []
        for k in range(runs):
            net = create_network(f"fan-{k}")
            net.task("start", bots[0])
            with net.parallel("fan", depends_on="start"):
                for i in range(tasks - 2):
                    net.task(f"t{i}", bots[i % 3])
            net.task("join", bots[2], depends_on=["fan"])
            nets.append(net)
        started = time.perf_counter()
        handles = [coordinator.submit(net, "go", stream=False) for net in nets]
        for handle in handles:
            assert handle.wait(timeout=600).status == "completed"
        return runs * tasks / (time.perf_counter() - started)
    finally:
        _stop_all(procs)


def redis_cpu(ports: list[int]) -> float:
    """CPU seconds the Redis servers on ``ports`` have used (user + sys)."""
    import redis

    total = 0.0
    for port in ports:
        info = redis.Redis(port=port).info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--robots", type=int, default=6)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=10)
    args = parser.parse_args()
    from tests.redis_cluster import RedisCluster, SingleRedis

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the servers are stopped
    single, cluster = SingleRedis(), RedisCluster()
    try:
        urls = {"single": single.start(), "cluster": cluster.start()}
        if not all(urls.values()):
            raise SystemExit(f"could not start servers: {single.reason or cluster.reason}")
        print(f"cpus: {os.cpu_count()}  load: {os.getloadavg()[0]:.1f}  workers: {args.workers}  "
              f"robots: {args.robots}")
        results: dict[str, dict[str, float]] = {}
        ports = {"single": list(single.procs), "cluster": list(cluster.procs)}
        for side, url in urls.items():
            cpu, wall = redis_cpu(ports[side]), time.perf_counter()
            publish, drain = bench_bus(url, args.workers, args.robots, args.messages)
            dag = bench_dag(url, args.workers, args.runs, args.tasks)
            busy = 100 * (redis_cpu(ports[side]) - cpu) / (time.perf_counter() - wall)
            results[side] = {"bus publish msgs/s": publish, "bus drain msgs/s": drain, "DAG tasks/s": dag,
                             "Redis CPU, % of a core": busy}
        print(f"{'':24}{'one Redis':>12}{'3-primary cluster':>20}{'cluster/single':>16}")
        for name in results["single"]:
            a, b = results["single"][name], results["cluster"][name]
            print(f"{name:24}{a:12.2f}{b:20.2f}{b / a:15.2f}x")
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        cluster.stop()
        single.stop()


if __name__ == "__main__":
    main()
