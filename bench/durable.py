"""Benchmark: what a parked run costs, and how fast an answer resumes it.

Run: ``.venv/bin/python bench/durable.py [--runs 50] [--rounds 20]`` (uses REDIS_URL or
redis://127.0.0.1:6379/0 with a unique key prefix; cleans up after). One real
``robot-lab worker --in-flight 4`` process serves a robot that asks ``ask_user`` once.

(a) ``--runs`` runs park at once: the Redis bytes they hold per run (MEMORY USAGE of every
    key of the runs and their input requests, divided by the runs), and the threads of the
    worker process before they were submitted and while all of them wait (held by parked
    runs: the difference);
(b) latency, ``--rounds`` times each, medians: from ``answer()`` to the resumed task's end
    (the journal replays the first model call and the question, then one live model call and
    the result) against a fresh one-task run from ``submit()`` to its end (one model call and
    the result) on the same worker -- the ratio is what resuming costs over starting.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
os.environ.setdefault("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")

SCRIPT = "turns:\n  - tool_calls: [{name: ask_user, arguments: {question: \"Which order?\"}}]\n  - reply: \"ok {tool_results}\"\n"


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def _wait(predicate, timeout: float = 120.0, interval: float = 0.01):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit("timed out waiting")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = f"rlbench-durable-{uuid.uuid4().hex[:8]}"
    os.environ["ROBOT_LAB_KEY_PREFIX"] = prefix
    os.environ["REDIS_URL"] = url
    import tempfile

    import redis

    from robot_lab.runtime.registry import publish_specs
    from robot_lab.keys import Keys
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.network.human_input import pending
    from robot_lab.runtime.robot import build

    scripts = Path(tempfile.mkdtemp(prefix="rl-durable-"))
    (scripts / "bench-ask.yml").write_text(SCRIPT)
    os.environ["ROBOT_LAB_SCRIPTS_DIR"] = str(scripts)
    connection = redis.Redis.from_url(url)
    keys = Keys(prefix=prefix)
    asker = build(f"asker-{uuid.uuid4().hex[:6]}", model="scripted/bench-ask",
                  local_tools=["robot_lab.runtime.durable.human:AskUser"])
    fresh = build(f"fresh-{uuid.uuid4().hex[:6]}", model="scripted/text:ok")
    publish_specs([asker.to_spec(), fresh.to_spec()], connection=connection)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-m", "robot_lab", "worker", asker.name, fresh.name, "--no-bus",
                               "--in-flight", "4"], env=env, cwd=ROOT)
    coordinator = Coordinator(connection=connection, keys=keys)
    ask_net, fresh_net = create_network("ask"), create_network("fresh")
    ask_net.task("ask", asker, tools="inherit")
    fresh_net.task("only", fresh)
    from rq import Queue, Worker

    try:
        _wait(lambda: Worker.all(queue=Queue(f"robot:{asker.name}", connection=connection)), timeout=60)
        time.sleep(0.5)
        coordinator.submit(fresh_net, "warm").wait(timeout=60)
        before = _threads(worker.pid)
        handles = [coordinator.submit(ask_net, f"order {i}") for i in range(args.runs)]
        _wait(lambda: all(h.states().get("ask") == "waiting" for h in handles))
        time.sleep(0.5)
        parked_threads = _threads(worker.pid)
        run_bytes = sum(connection.memory_usage(k) or 0 for h in handles
                        for k in connection.scan_iter(match=f"{keys.run(h.run_id)}*", count=1000))
        request_bytes = sum(connection.memory_usage(keys.input_request(r.id)) or 0 for r in pending(connection, keys))
        index_bytes = sum(connection.memory_usage(k) or 0 for k in (keys.inputs_pending(), keys.inputs_deadlines()))
        print(f"redis: {url}  prefix: {prefix}  cpus: {os.cpu_count()}")
        print(f"(a) {args.runs} parked runs, one worker --in-flight 4:")
        print(f"    Redis bytes per parked run: {(run_bytes + request_bytes + index_bytes) / args.runs:,.0f} "
              f"(run keys incl. events and step journal {run_bytes / args.runs:,.0f}, input request "
              f"{request_bytes / args.runs:,.0f}, indexes {index_bytes / args.runs:,.0f})")
        print(f"    worker threads: {before} before, {parked_threads} with all parked -> held by parked runs: "
              f"{parked_threads - before}")
        for h in handles:
            h.answer("A1")
        for h in handles:
            h.wait(timeout=120)

        resumes, starts = [], []
        for _ in range(args.rounds):  # alternate: a load change hits both alike
            h = coordinator.submit(ask_net, "order")
            _wait(lambda: h.states().get("ask") == "waiting")
            t0 = time.perf_counter()
            h.answer("A1")
            h.wait(timeout=60)
            resumes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            coordinator.submit(fresh_net, "go").wait(timeout=60)
            starts.append(time.perf_counter() - t0)
        resume, start = statistics.median(resumes), statistics.median(starts)
        print(f"(b) median of {args.rounds}: answer -> resumed task done {resume * 1000:.1f} ms; "
              f"fresh submit -> task done {start * 1000:.1f} ms (ratio {resume / start:.2f}x)")
    finally:
        worker.terminate()
        worker.wait(30)
        for key in connection.scan_iter(match=f"{prefix}*", count=1000):
            connection.delete(key)
        for robot in (asker.name, fresh.name):
            Queue(f"robot:{robot}", connection=connection).delete(delete_jobs=True)


if __name__ == "__main__":
    main()
