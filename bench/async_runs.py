"""Async runs benchmark: N ``await robot.arun(...)`` gathered on one event loop, beside the
same runs done with the sync ``robot.run`` one after another, with a model that sleeps.

    .venv/bin/python bench/async_runs.py [--runs 200] [--latency-ms 400] [--conversations]

Prints wall time, runs/s and p50/p99 latency of the async side, the ideal (one model
latency), the sequential figure (measured on a few sync runs, times N) and the CPU the
async side used (what bounds its wall time on a busy or small machine). With
``--conversations`` every run continues its own conversation of ONE robot (history loaded
and saved in Redis -- the embedded fakeredis unless REDIS_URL is set); without, each run has
its own robot. Numbers, not assertions: the machine decides them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from robot_lab.runtime.robot import Robot  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def gathered(args: argparse.Namespace, model: str) -> tuple[float, list[float]]:
    shared = Robot("bench", model=model)
    robots = [shared if args.conversations else Robot(f"bench-{i}", model=model) for i in range(args.runs)]
    latencies: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        kwargs = {"conversation_id": f"conv-{i}"} if args.conversations else {}
        await robots[i].arun(f"hello {i}", **kwargs)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.runs)))
    return time.perf_counter() - started, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--latency-ms", type=int, default=400)
    parser.add_argument("--conversations", action="store_true", help="one robot, a conversation per run")
    parser.add_argument("--sync-sample", type=int, default=3, help="sync runs measured for the sequential figure")
    args = parser.parse_args()
    model = f"scripted/sleep:{args.latency_ms}"

    Robot("warm", model="scripted/echo").run("warm up")  # litellm's import is not part of the figures
    started = time.perf_counter()
    for i in range(args.sync_sample):
        Robot(f"sync-{i}", model=model).run("hello")
    per_sync = (time.perf_counter() - started) / args.sync_sample

    cpu_started = time.process_time()
    wall, latencies = asyncio.run(gathered(args, model))
    cpu = time.process_time() - cpu_started
    ideal = args.latency_ms / 1000
    sequential = per_sync * args.runs
    mode = "one robot, a conversation each" if args.conversations else "a robot each"
    print(f"{args.runs} runs ({mode}), model latency {args.latency_ms} ms")
    print(f"  async, gathered on one loop : wall {wall:7.2f} s  {args.runs / wall:7.1f} runs/s  "
          f"p50 {percentile(latencies, 50) * 1000:7.0f} ms  p99 {percentile(latencies, 99) * 1000:7.0f} ms")
    print(f"  CPU of this process         : {cpu:7.2f} s  ({cpu / args.runs * 1000:.1f} ms/run: the wall cannot go "
          f"below {cpu:.2f} s on one core)")
    print(f"  ideal (one model latency)   : wall {ideal:7.2f} s   -> async is {wall / ideal:5.2f}x the ideal")
    print(f"  sync, one after another     : wall {sequential:7.2f} s  ({per_sync * 1000:.0f} ms/run x {args.runs}, "
          f"measured on {args.sync_sample}) -> async is {sequential / wall:5.1f}x faster")


if __name__ == "__main__":
    main()
