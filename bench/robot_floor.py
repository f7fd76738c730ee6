"""Benchmark: what a robot's run alone costs in CPU when many run at once in one process.

The in-flight worker's fan-out (bench/concurrency.py) is bound by its CPU: one interpreter
lock, so wall >= the worker's CPU time, and 1.5x the ideal at 1000 tasks leaves about 1 ms of
worker CPU per task for everything -- the claim, the robot's run, the result, rq's records.
This measures the robot's run by itself (``Robot.from_spec(spec).run(...)``, as a network
task runs it, on the offline scripted model, no Redis) three ways in one run:

- one after another (warm caches: the cheapest a run gets);
- N at once on N threads, the model sleeping ``--sleep-ms`` (as in the worker);
- N at once as ``arun`` coroutines on one event loop (the asyncio executor issue 30 asked to
  consider);

beside the baseline of a thread that only sleeps (an arq job of nothing but the sleep), and
prints each one's CPU per run and its share of the 1 ms budget.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time


def cpu_per(label: str, count: int, body) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    wall = time.perf_counter()
    body()
    cpu = (time.process_time() - start) / count
    print(f"  {label:44} {cpu * 1e6:7.0f} us CPU per run   (wall {time.perf_counter() - wall:5.2f} s)")
    return cpu


def on_threads(count: int, fn) -> None:  # type: ignore[no-untyped-def]
    threads = [threading.Thread(target=fn) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--sleep-ms", type=int, default=400)
    parser.add_argument("--budget-ms", type=float, default=1.0,
                        help="worker CPU per task that 1.5x ideal leaves at --count (bench/concurrency.py prints it)")
    args = parser.parse_args()

    from robot_lab.runtime.robot import Robot, build

    n, sleep = args.count, args.sleep_ms / 1000
    echo = build("floor-echo", model="scripted/echo").to_spec()
    sleepy = build("floor-sleep", model=f"scripted/sleep:{args.sleep_ms}").to_spec()
    for _ in range(50):  # warm: imports, caches
        Robot.from_spec(echo).run("hi")
    print(f"a robot's run alone, {n} runs, model sleeping {args.sleep_ms} ms where it sleeps (cpus: see nproc)")
    sequential = cpu_per("one after another (echo model, warm)", n,
                         lambda: [Robot.from_spec(echo).run("hi") for _ in range(n)])
    bare = cpu_per(f"{n} threads that only sleep (the baseline)", n, lambda: on_threads(n, lambda: time.sleep(sleep)))
    threaded = cpu_per(f"{n} at once on threads", n, lambda: on_threads(n, lambda: Robot.from_spec(sleepy).run("hi")))

    async def gathered() -> None:
        await asyncio.gather(*[Robot.from_spec(sleepy).arun("hi") for _ in range(n)])

    coroutines = cpu_per(f"{n} at once as coroutines (arun)", n, lambda: asyncio.run(gathered()))
    budget = args.budget_ms / 1000
    print(f"\n  at once / one after another: threads {threaded / sequential:.1f}x ({(threaded - bare) / sequential:.1f}x "
          f"less the thread's own cost), coroutines {coroutines / sequential:.1f}x: the same runs, interleaved")
    print(f"  of a {args.budget_ms:.2f} ms budget per task: the run alone on threads {threaded / budget:.0%} "
          f"(its thread's own cost {bare / budget:.0%}), as coroutines {coroutines / budget:.0%}")


if __name__ == "__main__":
    main()
