"""Benchmark: many runs in flight in ONE worker process.

Run: ``.venv/bin/python bench/concurrency.py [--count 200] [--sleep-ms 400] [--in-flight 200]
[--sequential-count 10]`` (uses ``--url`` / REDIS_URL, else starts a private redis-server on a
free port; a unique key prefix; cleans up after).

One ``robot-lab worker BOT --in-flight N`` process serves a robot whose scripted model sleeps
``--sleep-ms`` per call (``scripted/sleep:400``), then:

(a) bus: ``--count`` messages on as many conversations are published at once; each reply
    goes back to the sender's inbox. Latency = reply read - message published.
(b) network: a fan-out network of ``--count`` parallel tasks on that robot. Latency =
    ``task.completed`` event - submit.

(c) with ``--peer-python PYTHON`` (an interpreter with arq installed; arq pins redis-py < 6,
    so a venv of its own): (b) and the same fan-out on one arq worker (bench/peer_arq_fanout.py:
    every job in flight on asyncio, a job body of nothing but the sleep) in ``--peer-rounds``
    alternating rounds; medians of wall, submit, ratio to ideal and worker CPU per item, and
    robot-lab / arq.

For each: wall time (first publish / submit to last reply / result), msgs/s, p50/p99 latency
and the peak RSS of the worker's process tree (VmHWM of each process, reset before the
phase), beside the ideal (one model latency plus the time it took to publish / submit) and
the sequential figure: the same work with ``--in-flight 1`` on ``--sequential-count`` items,
scaled to ``--count``, and where the CPU went: the worker's process tree, the Redis server
(when it runs on this machine) and this process (submit, follow, sweeps). Targets: wall <= 2x
ideal (the fan-out: <= 1.5x at ``--count 1000 --in-flight 1000``, <= 2x at 5000), peak RSS
<= 400 MB (the fan-out at 1000: <= 120 MB). ``--only network`` skips the bus phase (and its
threads: the pool is shared, see robot_lab/threads.py).

On a shared 2-core machine the worker's CPU bounds the wall: a fan-out's worker needs about
1 ms of CPU per task for 1.5x at 1000 tasks, so read the CPU lines beside the ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_server import RedisServer  # noqa: E402  (the suite's private server)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
os.environ.setdefault("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --- the worker's process tree ---------------------------------------------------------------
def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def _status(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak(pid: int) -> None:
    for p in tree(pid):
        try:
            Path(f"/proc/{p}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            pass


def peak_rss(pid: int) -> int:
    return sum(_status(p, "VmHWM") for p in tree(pid))


def rss(pid: int) -> int:
    return sum(_status(p, "VmRSS") for p in tree(pid))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the worker's process tree so far."""
    total = 0.0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def threads(pid: int) -> int:
    return sum(_status(p, "Threads") // 1024 for p in tree(pid))


# --- the run ---------------------------------------------------------------------------------
def start_worker(url: str, prefix: str, robot: str, in_flight: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, REDIS_URL=url, ROBOT_LAB_KEY_PREFIX=prefix, PYTHONPATH=str(ROOT),
               ROBOT_LAB_LOG_FORMAT="json")
    robot_lab = Path(sys.executable).parent / "robot-lab"
    return subprocess.Popen([str(robot_lab), "worker", robot, "--in-flight", str(in_flight)], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(client, robot: str, prefix: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    """Ready = rq registered the worker and the robot's consumer group has a consumer."""
    from rq import Queue, Worker

    from robot_lab.keys import Keys

    inbox = Keys(prefix=prefix).inbox(robot)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited with {proc.returncode}")
        try:
            consumers = client.xinfo_consumers(inbox, robot)
        except Exception:
            consumers = []
        if consumers and Worker.all(queue=Queue(f"robot:{robot}", connection=client)):
            return
        time.sleep(0.2)
    raise SystemExit("worker did not get ready")


def bus_phase(client, bus, robot: str, count: int) -> dict[str, float]:
    sender = f"bench-client-{uuid.uuid4().hex[:6]}"
    bus.register(sender)
    inbox = bus.keys.inbox(sender)
    start = time.perf_counter()
    sent: dict[str, float] = {}
    for i in range(count):
        message = bus.publish(robot, f"hello {i}", from_=sender, conversation_id=f"conv-{i}")
        sent[message.id] = time.perf_counter()
    published = time.perf_counter() - start
    got: dict[str, float] = {}
    cursor = "0-0"
    from robot_lab.schemas import decode_message

    while len(got) < count and time.perf_counter() - start < 600:
        res = client.xread({inbox: cursor}, count=500, block=1000)
        now = time.perf_counter()
        for _, entries in res or []:
            for entry_id, fields in entries:
                cursor = entry_id
                reply = decode_message(fields[b"envelope"])
                if reply.in_reply_to in sent:
                    got[reply.in_reply_to] = now
    wall = time.perf_counter() - start
    client.delete(inbox)
    latencies = [got[m] - sent[m] for m in got]
    return {"wall": wall, "published": published, "done": len(got), "latencies": latencies}


def network_phase(client, robot_obj, count: int) -> dict[str, float]:
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network

    net = create_network(f"fan{count}")
    with net.parallel("fan"):
        for i in range(count):
            net.task(f"t{i}", robot_obj)
    start = time.perf_counter()
    started_wall = time.time()
    handle = Coordinator(connection=client).submit(net, "go")
    submitted = time.perf_counter() - start
    result = handle.wait(timeout=600)
    wall = time.perf_counter() - start
    done = [e.ts for _, e in handle.store.events() if e.event == "task.completed"]
    latencies = [ts - started_wall for ts in done]
    ok = sum(1 for r in result.context.values() if not r.error)
    return {"wall": wall, "published": submitted, "done": ok, "latencies": latencies}


def redis_cpu(client) -> float | None:  # type: ignore[no-untyped-def]
    """CPU seconds the Redis server has used, when it runs on this machine (else None)."""
    try:
        pid = int(client.info("server")["process_id"])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


def report(title: str, figures: dict, count: int, sleep: float, sequential_per_item: float, peak: int,
           n_threads: int, cpu: float, others: str = "") -> None:
    wall, lat = figures["wall"], figures["latencies"]
    ideal = sleep + figures["published"]
    sequential = sequential_per_item * count
    print(f"\n{title}: {figures['done']}/{count} done")
    print(f"  wall           {wall:8.2f} s    ideal {ideal:6.2f} s (model {sleep:.2f} s + publish "
          f"{figures['published']:.2f} s)   ratio {wall / ideal:5.2f}x")
    print(f"  sequential     {sequential:8.2f} s    (--in-flight 1: {sequential_per_item * 1000:.0f} ms/item x {count})"
          f"   speed-up {sequential / wall:5.1f}x")
    print(f"  throughput     {figures['done'] / wall:8.1f} msgs/s")
    print(f"  latency        p50 {percentile(lat, 0.5) * 1000:7.0f} ms   p99 {percentile(lat, 0.99) * 1000:7.0f} ms")
    print(f"  peak RSS       {peak / 2**20:8.0f} MB (worker process tree), "
          f"{n_threads} threads at the end")
    print(f"  worker CPU     {cpu:8.2f} s    ({cpu / count * 1000:.1f} ms per item; one interpreter lock: "
          f"wall >= CPU)")
    if others:
        print(f"  other CPU      {others}")
    print(f"  machine load   {os.getloadavg()[0]:.2f} (1 min)")


def sequential_rate(client, url: str, prefix: str, bot, count: int, tmp: Path) -> tuple[float, float]:
    """Seconds per message and per task of the same worker with --in-flight 1."""
    from robot_lab.bus import Bus
    from robot_lab.keys import Keys

    proc = start_worker(url, prefix, bot.name, 1, tmp / "worker-seq.log")
    try:
        wait_ready(client, bot.name, prefix, proc)
        bus = Bus(client, keys=Keys(prefix=prefix))
        a = bus_phase(client, bus, bot.name, count)
        b = network_phase(client, bot, count)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    return a["wall"] / count, b["wall"] / count


def peer_comparison(client, bot, pid: int, url: str, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """robot-lab's fan-out and arq's (bench/peer_arq_fanout.py, one arq worker with every job
    in flight on asyncio, a job body of nothing but the sleep) in alternating rounds; medians."""
    import json
    import statistics

    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(args.peer_rounds):
        cpu = cpu_seconds(pid)
        figures = network_phase(client, bot, args.count)
        figures["worker_cpu"] = cpu_seconds(pid) - cpu
        ours.append(figures)
        out = subprocess.run([args.peer_python, str(ROOT / "bench" / "peer_arq_fanout.py"), "--url", url,
                              "--count", str(args.count), "--sleep-ms", str(args.sleep_ms),
                              "--poll-delay", str(args.peer_poll_delay)],
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise SystemExit(f"peer run failed: {out.stderr[-2000:]}")
        theirs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    sleep = args.sleep_ms / 1000

    def med(rows: list[dict[str, float]], what: str) -> float:
        return statistics.median(r[what] for r in rows)

    print(f"\n(c) the same fan-out beside arq, median of {args.peer_rounds} alternating rounds "
          f"(load {os.getloadavg()[0]:.2f}):")
    print(f"  {'':12} {'wall':>8} {'submit':>8} {'after submit':>13} {'ratio to ideal':>15} {'worker CPU/item':>16}")
    for name, rows in (("robot-lab", ours), ("arq", theirs)):
        wall, pub = med(rows, "wall"), med(rows, "published")
        ratio = statistics.median(r["wall"] / (sleep + r["published"]) for r in rows)
        print(f"  {name:12} {wall:7.2f}s {pub:7.2f}s {wall - pub:12.2f}s {ratio:14.2f}x "
              f"{med(rows, 'worker_cpu') / args.count * 1000:13.1f} ms")
    target = 1.5 if args.count <= 1000 else 2.0  # issue 30's targets: 1.5x at 1000 tasks, 2x at 5000
    bound = target * (sleep + med(ours, "published"))
    print(f"  {target}x robot-lab's ideal is {bound:.2f} s: at most {bound / args.count * 1000:.2f} ms of worker CPU per "
          f"task (one interpreter lock: wall >= CPU), against arq's {med(theirs, 'worker_cpu') / args.count * 1000:.2f} ms "
          f"for a job that only sleeps")
    print(f"  robot-lab / arq: wall {med(ours, 'wall') / med(theirs, 'wall'):.2f}x, worker CPU per item "
          f"{med(ours, 'worker_cpu') / med(theirs, 'worker_cpu'):.2f}x (an arq job here is only the sleep; "
          f"a robot-lab task runs a robot, journals its step and records its result exactly once)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--sleep-ms", type=int, default=400)
    parser.add_argument("--sequential-count", type=int, default=10)
    parser.add_argument("--only", choices=["all", "network"], default="all")
    parser.add_argument("--peer-python", metavar="PYTHON",
                        help="an interpreter with arq installed: the same fan-out on one arq worker, side by side")
    parser.add_argument("--peer-rounds", type=int, default=3,
                        help="with --peer-python: alternating rounds of robot-lab's fan-out and arq's (medians)")
    parser.add_argument("--peer-poll-delay", type=float, default=0.01,
                        help="with --peer-python: arq's poll_delay (default 0.01 s, arq at its fastest; arq's own "
                             "default is 0.5 s)")
    args = parser.parse_args()

    server = RedisServer()
    url = server.bench_url(args.url)
    prefix = f"bench-conc-{uuid.uuid4().hex[:8]}"
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    os.environ["REDIS_URL"] = url
    from robot_lab.runtime.registry import publish_specs
    from robot_lab.bus import Bus
    from robot_lab.connection import connect
    from robot_lab.keys import Keys
    from robot_lab.runtime.robot import build
    from robot_lab.settings import reload_settings

    reload_settings()
    client = connect(url)
    keys = Keys(prefix=prefix)
    bot = build(f"conc-{uuid.uuid4().hex[:6]}", model=f"scripted/sleep:{args.sleep_ms}")
    publish_specs([bot.to_spec()], connection=client, keys=keys)
    sleep = args.sleep_ms / 1000
    tmp = Path(tempfile.mkdtemp(prefix="bench-conc-"))
    print(f"robot-lab worker --in-flight {args.in_flight}: {args.count} items, model sleeps {args.sleep_ms} ms "
          f"(cpus: {os.cpu_count()})")
    try:
        seq_msg, seq_task = sequential_rate(client, url, prefix, bot, args.sequential_count, tmp)
        proc = start_worker(url, prefix, bot.name, args.in_flight, tmp / "worker.log")
        try:
            wait_ready(client, bot.name, prefix, proc)
            bus = Bus(client, keys=keys)
            bus_phase(client, bus, bot.name, min(args.count, 20))  # warm: robots built, threads up
            network_phase(client, bot, min(args.count, 20))
            print(f"worker idle RSS after warm-up: {rss(proc.pid) / 2**20:.0f} MB")
            phases = [("(b) network: fan-out of {n} parallel tasks", lambda: network_phase(client, bot, args.count),
                       seq_task)]
            if args.only == "all":
                phases.insert(0, ("(a) bus: {n} messages on {n} conversations",
                                  lambda: bus_phase(client, bus, bot.name, args.count), seq_msg))
            for title, phase, per_item in phases:
                reset_peak(proc.pid)
                cpu, redis_was, mine = cpu_seconds(proc.pid), redis_cpu(client), time.process_time()
                figures = phase()
                after = redis_cpu(client)
                others = (f"Redis {after - redis_was:.2f} s, " if redis_was is not None and after is not None else "") + \
                    f"this process (submit, follow, sweeps) {time.process_time() - mine:.2f} s"
                report(title.format(n=args.count), figures, args.count, sleep, per_item, peak_rss(proc.pid),
                       threads(proc.pid), cpu_seconds(proc.pid) - cpu, others)
            if args.peer_python:
                peer_comparison(client, bot, proc.pid, url, args)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        server.stop()
        print(f"\nworker logs: {tmp}")


if __name__ == "__main__":
    main()
