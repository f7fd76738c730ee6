"""Benchmark: what a robot's run alone costs in CPU when many run at once in one process.

The in-flight worker's fan-out (bench/concurrency.py) is bound by its CPU: one interpreter
lock, so wall >= the worker's CPU time, and 1.5x the ideal at 1000 tasks leaves about 1 ms of
worker CPU per task for everything -- the claim, the robot's run, the result, rq's records.
This measures the robot's run by itself (``Robot.from_spec(spec).run(...)``, as a network
task runs it, on the offline scripted model, no Redis) three ways in one run:

- one after another (warm caches: the cheapest a run gets);
- N at once on N warm threads (started before the clock runs, as the worker's pool threads
  are), the model sleeping ``--sleep-ms``;
- N at once as ``arun`` coroutines on one event loop (the asyncio executor issue 30 asked to
  consider);

beside the baseline of a warm thread that only sleeps (an arq job of nothing but the sleep), and
prints each one's CPU per run and its share of the 1 ms budget.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import threading
import time


ROUNDS = 3


def cpu_per(label: str, count: int, body) -> float:  # type: ignore[no-untyped-def]
    """Median over ``ROUNDS`` of ``body``'s CPU per run (a run of thousands of threads varies
    from round to round: now and then they convoy on the interpreter lock)."""
    cpus, walls = [], []
    for _ in range(ROUNDS):
        start, wall = time.process_time(), time.perf_counter()
        body()
        cpus.append((time.process_time() - start) / count)
        walls.append(time.perf_counter() - wall)
    cpu = statistics.median(cpus)
    print(f"  {label:46} {cpu * 1e6:7.0f} us CPU per run, median of {ROUNDS} "
          f"({min(cpus) * 1e6:.0f}-{max(cpus) * 1e6:.0f}; wall {statistics.median(walls):5.2f} s)")
    return cpu


class WarmThreads:
    """``count`` threads started before the clock runs, each taking one call at a time (the
    worker's pool threads: started once, then reused), so thread starts are not counted."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Semaphore(0)
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        while (fn := self._work.get()) is not None:
            fn()
            self._done.release()

    def run(self, fn) -> None:  # type: ignore[no-untyped-def]
        """``fn`` once on each thread, all at once; returns when every call has."""
        for _ in range(self.count):
            self._work.put(fn)
        for _ in range(self.count):
            self._done.acquire()

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--sleep-ms", type=int, default=400)
    parser.add_argument("--budget-ms", type=float, default=1.0,
                        help="worker CPU per task that 1.5x ideal leaves at --count (bench/concurrency.py prints it)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    global ROUNDS
    ROUNDS = max(1, args.rounds)

    from robot_lab.runtime.robot import Robot, build
    from robot_lab.workers.inflight import tune_gc, tune_switch_interval

    n, sleep = args.count, args.sleep_ms / 1000
    echo = build("floor-echo", model="scripted/echo").to_spec()
    sleepy = build("floor-sleep", model=f"scripted/sleep:{args.sleep_ms}").to_spec()
    for _ in range(50):  # warm: imports, caches
        Robot.from_spec(echo).run("hi")
    interval = tune_switch_interval(n)  # as robot-lab worker --in-flight N does
    tune_gc()
    print(f"a robot's run alone, {n} runs at once, model sleeping {args.sleep_ms} ms where it sleeps "
          f"(the worker's switch interval for {n} slots: {interval * 1000:.0f} ms, its collector tuning)")
    sequential = cpu_per("one after another (echo model, warm)", n,
                         lambda: [Robot.from_spec(echo).run("hi") for _ in range(n)])
    pool = WarmThreads(n)
    time.sleep(0.5)  # every thread waiting for work
    bare = cpu_per(f"{n} warm threads that only sleep (the baseline)", n, lambda: pool.run(lambda: time.sleep(sleep)))
    threaded = cpu_per(f"{n} at once on {n} warm threads", n, lambda: pool.run(lambda: Robot.from_spec(sleepy).run("hi")))
    pool.close()

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
