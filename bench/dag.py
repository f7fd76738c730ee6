"""Benchmark: per-task overhead of robot-lab networks vs raw rq, and scaling over workers.

Run: ``.venv/bin/python bench/dag.py [--tasks 200] [--rounds 3] [--scale-tasks 64] [--sleep-ms 200]``
(uses REDIS_URL or redis://127.0.0.1:6379/0 with a unique key prefix; cleans up after).

(a) raw rq: enqueue N no-op jobs (JSON serializer) and drain them with one rq SimpleWorker;
(b) robot-lab: a fan-out/fan-in network of N tasks on the scripted model, one SimpleWorker;
both print the per-task time and the ratio (target: robot-lab <= 2x raw rq);
(d) the same network on robot-lab's own worker class (``robot-lab worker``: task jobs on its
lean lifecycle, workers/task_lifecycle.py; target <= 1.2x raw rq). The sides
alternate for ``--rounds`` rounds and the medians are printed (the ratio is the median of each
round's ratio), so a machine whose load changes during the run skews both sides alike. Then
the CPU time per job / task (this process, which runs the worker, plus the Redis server when
it runs on this machine: a figure waiting on a busy machine does not inflate) and the Redis
round trips of each side (counted on a second, shorter pass).
(c) scaling: the same fan-out network of 64 tasks whose scripted model sleeps 200 ms per call,
on 1, 2 and 4 worker processes (timed once they are all up), wall times and speed-up
(target >= 3.5x at 4 workers).
(e) a fleet: ``--fleet-tasks`` (1000) no-op tasks through ``--fleet-workers`` (4) worker
processes -- raw rq no-op jobs on plain rq workers against a robot-lab fan-out on robot-lab's
rq loop -- in ``--fleet-rounds`` alternating rounds, wall time from the first enqueue / the
submit to the last result (target <= 1.3x), and whether any task ran twice (attempts > 1 or
``task.retrying``: a lease lost under load re-runs a task so); with each side's CPU per task:
the worker processes (read from /proc/<pid>/stat before and after), Redis, and this process
(the enqueue or the submit, and the wait), whose ratio moves less with other sessions' load
than the wall ratio. ``--only fleet`` runs just (e). Unlike (a), whose jobs are enqueued one
round trip each inside the timed part (~0.3 ms of a ~5 ms job), (e)'s raw side pipelines its
enqueue, so (d)'s ratio is the kinder of the two (docs/networks.md, "Benchmarks").
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
os.environ.setdefault("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")


def noop() -> None:
    return None


def _url() -> str:
    return os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


def _worker(connection, queues, own: bool = False):
    """rq's SimpleWorker (a plain ``rq worker``), or with ``own`` robot-lab's worker class
    (what ``robot-lab worker`` runs: task jobs on its own lean lifecycle)."""
    from rq import Queue
    from robot_lab.network.serializer import JobSerializer
    from rq.worker import SimpleWorker

    from robot_lab.workers.process import robot_worker_class

    qs = [Queue(q, connection=connection, serializer=JobSerializer) for q in queues]
    return (robot_worker_class() if own else SimpleWorker)(qs, connection=connection, serializer=JobSerializer)


def bench_raw_rq(connection, n: int) -> float:
    from rq import Queue
    from robot_lab.network.serializer import JobSerializer

    name = f"bench-raw-{uuid.uuid4().hex[:6]}"
    queue = Queue(name, connection=connection, serializer=JobSerializer)
    worker = _worker(connection, [name])
    started = time.perf_counter()
    for _ in range(n):
        queue.enqueue_call(func="__main__.noop", result_ttl=60)
    worker.work(burst=True, logging_level="WARNING")
    elapsed = time.perf_counter() - started
    queue.delete(delete_jobs=True)
    return elapsed / n


def fan_network(n: int, model: str, suffix: str):
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    bot = build(f"bench-{suffix}", model=model)
    net = create_network(f"fan{n}")
    net.task("start", bot)
    with net.parallel("fan", depends_on="start"):
        for i in range(n - 2):
            net.task(f"t{i}", bot)
    net.task("join", bot, depends_on=["fan"])
    return net, bot.name


def bench_robot_lab(connection, keys, n: int, stream: bool, own: bool = False) -> float:
    from robot_lab.network.coordinator import Coordinator

    net, robot = fan_network(n, "scripted/text:ok", uuid.uuid4().hex[:6])
    worker = _worker(connection, [f"robot:{robot}"], own)
    coordinator = Coordinator(connection=connection, keys=keys)
    started = time.perf_counter()
    handle = coordinator.submit(net, "go", stream=stream)
    worker.work(burst=True, logging_level="WARNING")
    elapsed = time.perf_counter() - started
    assert handle.status == "completed", handle.status
    return elapsed / n


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` of this machine has used (None: gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def redis_cpu_seconds(connection) -> float | None:  # type: ignore[no-untyped-def]
    """CPU seconds the Redis server has used, when it runs on this machine (else None)."""
    try:
        pid = int(connection.info("server")["process_id"])
        if "redis" not in Path(f"/proc/{pid}/comm").read_text():
            return None  # another pid namespace (a container): not our server
        return process_cpu_seconds(pid)
    except Exception:
        return None


def measure(connection, n: int, fn, *args) -> tuple[float, float, float | None]:  # type: ignore[no-untyped-def]
    """``fn(*args)``'s wall time per task, and this process's and Redis's CPU time per task."""
    cpu, server = time.process_time(), redis_cpu_seconds(connection)
    wall = fn(*args)
    after = redis_cpu_seconds(connection)
    return wall, (time.process_time() - cpu) / n, None if server is None or after is None else (after - server) / n


def median(values: list[float]) -> float:
    return statistics.median(values)


def counting_connection(url: str):
    """A client whose connections count the round trips they make (one per command or
    pipeline sent); returns (client, counter)."""
    import redis

    sent = [0]

    class Counting(redis.Connection):
        def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
            sent[0] += 1
            return super().send_packed_command(command, check_health)

    return redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, connection_class=Counting)), sent


def round_trips(url: str, keys, n: int) -> tuple[float, float, float]:
    """Redis round trips per raw rq job and per robot-lab task (streaming on), on an rq
    worker and on robot-lab's."""
    client, sent = counting_connection(url)
    counts = []
    for side in (lambda: bench_raw_rq(client, n), lambda: bench_robot_lab(client, keys, n, True),
                 lambda: bench_robot_lab(client, keys, n, True, True)):
        sent[0] = 0
        side()
        counts.append(sent[0] / n)
    return counts[0], counts[1], counts[2]


def bench_robot_alone(n: int) -> float:
    """The robot's own cost per call (the scripted model, no litellm), no queue, no Redis."""
    from robot_lab.runtime.robot import Robot, build

    spec = build("alone", model="scripted/text:ok").to_spec()
    started = time.perf_counter()
    for _ in range(n):
        Robot.from_spec(spec).run("go")
    return (time.perf_counter() - started) / n


def _serve(url: str, queue: str, prefix: str) -> None:
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    from robot_lab.workers.process import _rq_loop, warm_up

    warm_up(["scripted/sleep"])  # a scripted robot's worker: no litellm, as `robot-lab worker` does
    _rq_loop(url, [queue], f"bench-{os.getpid()}", False)


def bench_scaling(url: str, keys, tasks: int, sleep_ms: int, workers: int) -> float:
    import redis

    from robot_lab.network.coordinator import Coordinator

    connection = redis.Redis.from_url(url)
    net, robot = fan_network(tasks, f"scripted/sleep:{sleep_ms}", uuid.uuid4().hex[:6])
    ctx = multiprocessing.get_context("spawn")  # never fork a process that runs litellm threads
    procs = [ctx.Process(target=_serve, args=(url, f"robot:{robot}", keys.prefix), daemon=True)
             for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        from rq import Queue, Worker

        deadline = time.time() + 120
        while len(Worker.all(queue=Queue(f"robot:{robot}", connection=connection))) < workers:
            if time.time() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.05)
        coordinator = Coordinator(connection=connection, keys=keys)
        started = time.perf_counter()
        handle = coordinator.submit(net, "go", stream=False)
        result = handle.wait(timeout=300)
        elapsed = time.perf_counter() - started
        assert result.status == "completed"
        return elapsed
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)


def _serve_raw(url: str, queue: str) -> None:
    """A plain rq worker process (rq's SimpleWorker, the JSON serializer)."""
    import redis
    from rq import Queue
    from rq.worker import SimpleWorker

    from robot_lab.network.serializer import JobSerializer

    connection = redis.Redis.from_url(url)
    SimpleWorker([Queue(queue, connection=connection, serializer=JobSerializer)], connection=connection,
                 serializer=JobSerializer).work(logging_level="WARNING")


def _fleet(url: str, target: Any, args_of: Any, queue: str, workers: int) -> list[Any]:
    """``workers`` spawned worker processes on ``queue``, returned once rq lists them all."""
    import redis
    from rq import Queue, Worker

    ctx = multiprocessing.get_context("spawn")  # never fork a process that runs litellm threads
    procs = [ctx.Process(target=target, args=args_of(), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    connection = redis.Redis.from_url(url)
    deadline = time.time() + 120
    while len(Worker.all(queue=Queue(queue, connection=connection))) < workers:
        if time.time() > deadline:
            raise RuntimeError("workers did not start")
        time.sleep(0.05)
    return procs


def _stop(procs: list[Any]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(10)


class FleetClock:
    """Wall time and CPU time of one side of (e), from its first enqueue / submit to its last
    result: the worker processes (each from /proc/<pid>/stat), Redis (when it runs on this
    machine) and this process (the enqueue or submit and the wait)."""

    def __init__(self, connection, procs: list[Any]) -> None:  # type: ignore[no-untyped-def]
        self.connection, self.pids = connection, [p.pid for p in procs]
        self.wall = self.workers = self.own = 0.0
        self.redis: float | None = None

    def __enter__(self) -> FleetClock:
        self._workers = [process_cpu_seconds(pid) or 0.0 for pid in self.pids]
        self._redis, self._own, self._wall = redis_cpu_seconds(self.connection), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = time.perf_counter() - self._wall
        self.own = time.process_time() - self._own
        self.workers = sum((process_cpu_seconds(pid) or 0.0) - before for pid, before in zip(self.pids, self._workers))
        after = redis_cpu_seconds(self.connection)
        self.redis = None if after is None or self._redis is None else after - self._redis

    def cpu(self) -> float:
        return self.workers + (self.redis or 0.0) + self.own


def fleet_raw(url: str, n: int, workers: int) -> FleetClock:
    """``n`` raw rq no-op jobs through ``workers`` plain rq worker processes (from the first
    enqueue to the last job finished)."""
    import redis
    from rq import Queue
    from rq.registry import FinishedJobRegistry

    from robot_lab.network.serializer import JobSerializer

    name = f"bench-fleet-{uuid.uuid4().hex[:6]}"
    procs = _fleet(url, _serve_raw, lambda: (url, name), name, workers)
    try:
        connection = redis.Redis.from_url(url)
        queue = Queue(name, connection=connection, serializer=JobSerializer)
        finished = FinishedJobRegistry(name, connection=connection)
        with FleetClock(connection, procs) as clock:
            pipe = connection.pipeline()
            for _ in range(n):
                queue.enqueue_call(func="__main__.noop", result_ttl=60, pipeline=pipe)
            pipe.execute()
            while finished.count < n:
                time.sleep(0.005)
        queue.delete(delete_jobs=True)
        return clock
    finally:
        _stop(procs)


def fleet_lab(url: str, keys, n: int, workers: int) -> tuple[FleetClock, int, int]:  # type: ignore[no-untyped-def]
    """An ``n``-task fan-out (no-op scripted model) through ``workers`` robot-lab worker
    processes, and what ran more than once: tasks with more than one attempt, and
    ``task.retrying`` events (a lost lease re-runs a task so)."""
    import redis

    from robot_lab.network.coordinator import Coordinator

    connection = redis.Redis.from_url(url)
    net, robot = fan_network(n, "scripted/text:ok", uuid.uuid4().hex[:6])
    procs = _fleet(url, _serve, lambda: (url, f"robot:{robot}", keys.prefix), f"robot:{robot}", workers)
    try:
        with FleetClock(connection, procs) as clock:
            handle = Coordinator(connection=connection, keys=keys).submit(net, "go", stream=False)
            result = handle.wait(timeout=600)
        assert result.status == "completed", result.status
        twice = sum(1 for a in handle.store.attempts().values() if a > 1)
        retried = sum(1 for e in handle.events() if e.event == "task.retrying")
        return clock, twice, retried
    finally:
        _stop(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of (a) and (b)")
    parser.add_argument("--scale-tasks", type=int, default=64)
    parser.add_argument("--sleep-ms", type=int, default=200)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--fleet-tasks", type=int, default=1000, help="(e): tasks through --fleet-workers processes")
    parser.add_argument("--fleet-workers", type=int, default=4)
    parser.add_argument("--fleet-rounds", type=int, default=3)
    parser.add_argument("--only", choices=["all", "fleet"], default="all", help="fleet: only (e)")
    args = parser.parse_args()

    prefix = f"rlbench-{uuid.uuid4().hex[:8]}"
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    import redis

    from robot_lab.keys import Keys
    from robot_lab.workers.process import warm_up

    url = _url()
    connection = redis.Redis.from_url(url)
    keys = Keys(prefix=prefix)
    warm_up(["scripted/text:ok"])
    try:
        print(f"redis: {url}  prefix: {prefix}  cpus: {os.cpu_count()}")
        if args.only == "fleet":
            fleet(url, keys, args)
            return
        bench_raw_rq(connection, 20)  # warm both paths
        bench_robot_lab(connection, keys, 10, True)
        n = args.tasks
        rounds: list[dict[str, tuple[float, float, float | None]]] = []
        for _ in range(args.rounds):  # the sides alternate: a load change hits both alike
            rounds.append({"raw": measure(connection, n, bench_raw_rq, connection, n),
                           "lab": measure(connection, n, bench_robot_lab, connection, keys, n, True),
                           "quiet": measure(connection, n, bench_robot_lab, connection, keys, n, False),
                           "own": measure(connection, n, bench_robot_lab, connection, keys, n, True, True)})
        raw, lab, quiet, own = (median([r[side][0] for r in rounds]) for side in ("raw", "lab", "quiet", "own"))
        ratio = median([r["lab"][0] / r["raw"][0] for r in rounds])
        ratio_own = median([r["own"][0] / r["raw"][0] for r in rounds])
        ratio_quiet = median([r["quiet"][0] / r["raw"][0] for r in rounds])
        print(f"median of {args.rounds} alternating rounds:")
        print(f"(a) raw rq, {n} no-op jobs, 1 worker:           {raw * 1000:8.2f} ms/job")
        print(f"(b) robot-lab, {n}-task fan-out network, 1 worker: {lab * 1000:8.2f} ms/task "
              f"(ratio {ratio:.2f}x; target <= 2x)")
        print(f"    same without text.delta streaming events:       {quiet * 1000:8.2f} ms/task "
              f"(ratio {ratio_quiet:.2f}x)")
        print(f"(d) the same on robot-lab's worker (its task lifecycle): {own * 1000:8.2f} ms/task "
              f"(ratio {ratio_own:.2f}x; target <= 1.2x)")
        cpu = {side: (median([r[side][1] for r in rounds]),
                      None if any(r[side][2] is None for r in rounds) else median([r[side][2] for r in rounds]))
               for side in ("raw", "lab", "own")}
        for side, title in (("lab", "rq worker"), ("own", "robot-lab worker")):
            if cpu["raw"][1] is not None and cpu[side][1] is not None:
                total_raw, total_lab = cpu["raw"][0] + cpu["raw"][1], cpu[side][0] + cpu[side][1]
                print(f"    CPU (this process + Redis), {title}: raw rq {cpu['raw'][0] * 1000:.2f} + "
                      f"{cpu['raw'][1] * 1000:.2f} ms/job, robot-lab {cpu[side][0] * 1000:.2f} + "
                      f"{cpu[side][1] * 1000:.2f} ms/task (ratio {total_lab / total_raw:.2f}x)")
            else:
                print(f"    CPU (this process), {title}: raw rq {cpu['raw'][0] * 1000:.2f} ms/job, robot-lab "
                      f"{cpu[side][0] * 1000:.2f} ms/task (ratio {cpu[side][0] / cpu['raw'][0]:.2f}x)")
        raw_trips, lab_trips, own_trips = round_trips(url, keys, min(args.tasks, 50))
        print(f"    Redis round trips: raw rq {raw_trips:.1f}/job, robot-lab {lab_trips:.1f}/task on an rq worker, "
              f"{own_trips:.1f}/task on robot-lab's (streaming on)")
        alone = bench_robot_alone(args.tasks)
        print(f"    for scale: the robot's own run alone (scripted model, no rq, no Redis): "
              f"{alone * 1000:.2f} ms/call")
        counts = [int(w) for w in args.workers.split(",")]
        walls = {}
        for count in counts:
            walls[count] = bench_scaling(url, keys, args.scale_tasks, args.sleep_ms, count)
            print(f"(c) {args.scale_tasks} tasks x {args.sleep_ms} ms on {count} worker process(es): "
                  f"{walls[count]:6.2f} s  speed-up {walls[counts[0]] / walls[count]:.2f}x")
        if 4 in walls:
            # start -> (n-2 in parallel) -> join: 2 + ceil((n-2)/4) sequential rounds at best
            rounds = 2 + -(-(args.scale_tasks - 2) // 4)
            print(f"    speed-up at 4 workers: {walls[counts[0]] / walls[4]:.2f}x (target >= 3.5x; "
                  f"this DAG's ceiling is {args.scale_tasks / rounds:.2f}x)")
        fleet(url, keys, args)
    finally:
        found = list(connection.scan_iter(match=f"{prefix}*", count=1000))
        if found:
            connection.delete(*found)


def fleet(url: str, keys, args) -> None:  # type: ignore[no-untyped-def]
    """(e): the same number of no-op tasks through the same number of worker processes, raw
    rq against robot-lab, alternating rounds; the ratio is the median of each round's. The
    CPU of each side (workers, Redis, this process) is printed too: on a shared machine a
    burst of someone else's load lengthens one side's wall time, hardly its CPU time."""
    n, workers = args.fleet_tasks, args.fleet_workers
    rounds: list[tuple[FleetClock, FleetClock]] = []
    twice = retried = 0
    loads = [os.getloadavg()[0]]
    for _ in range(args.fleet_rounds):
        raw = fleet_raw(url, n, workers)
        lab, t, r = fleet_lab(url, keys, n, workers)
        rounds.append((raw, lab))
        twice, retried = twice + t, retried + r
        loads.append(os.getloadavg()[0])
    ratios = [lab.wall / raw.wall for raw, lab in rounds]
    print(f"(e) {n} tasks through {workers} worker processes, median of {args.fleet_rounds} alternating rounds: "
          f"raw rq {median([raw.wall for raw, _ in rounds]):.2f} s, robot-lab {median([lab.wall for _, lab in rounds]):.2f} s "
          f"(ratio {median(ratios):.2f}x; target <= 1.3x; rounds {', '.join(f'{x:.2f}' for x in ratios)}; "
          f"load {min(loads):.1f}-{max(loads):.1f})")

    def per_task(clocks: list[FleetClock], part: str) -> str:
        values = [getattr(c, part) for c in clocks]
        return "n/a" if any(v is None for v in values) else f"{median(values) * 1000 / n:.2f}"

    for title, side in (("raw rq", [raw for raw, _ in rounds]), ("robot-lab", [lab for _, lab in rounds])):
        print(f"    CPU, {title}: workers {per_task(side, 'workers')} + Redis {per_task(side, 'redis')} + "
              f"this process {per_task(side, 'own')} ms/task")
    print(f"    CPU ratio (all three): {median([lab.cpu() / raw.cpu() for raw, lab in rounds]):.2f}x")
    print(f"    tasks run more than once: {twice} (attempts > 1), task.retrying events: {retried}")


if __name__ == "__main__":
    main()
