"""Observability benchmark: what the tracing and metrics hooks cost, off (the default: the
extras unconfigured) and on (spans to the OpenTelemetry SDK's in-memory exporter through a
SimpleSpanProcessor, Prometheus counters recording), on the same work in one process.

    .venv/bin/python bench/observability.py [--messages 2000] [--runs 20]

1. import cost: a child process publishes and handles a message with nothing configured and
   reports whether tracing resolved to off and whether prometheus_client got imported.
   (redis-py and litellm import opentelemetry themselves when it is installed; robot-lab
   then still finds no provider and no OTEL_* exporter variable: off.)
2. one hook, off: a function wrapped by ``otel.traced`` beside the bare function (ns/call).
3. the bus: publish + poll ``--messages`` envelopes on fakeredis (us/message), off then on.
4. a network: ``--runs`` embedded runs of a 4-task DAG on the scripted model (ms/run), off then on.

Off and on alternate round by round in the same process (the bench switches the hooks
directly); medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fakeredis  # noqa: E402

from robot_lab.bus import Bus, BusPoller  # noqa: E402
from robot_lab.keys import Keys  # noqa: E402
from robot_lab.observability import metrics, otel  # noqa: E402
from robot_lab.network.dsl import create_network  # noqa: E402
from robot_lab.runtime.robot import build  # noqa: E402

CHILD = """
import sys, fakeredis
from robot_lab.bus import Bus, BusPoller
from robot_lab.observability import otel
r = fakeredis.FakeRedis()
bus = Bus(redis=r)
poller = BusPoller("bench", bus, block_ms=0)
poller.on_message(lambda m: None)
bus.publish("bench", "hello", create=True)
poller.poll(max_messages=1, block_ms=0)
print(any(m.startswith("opentelemetry") for m in sys.modules), "prometheus_client" in sys.modules,
      otel.tracer() is None)
"""


def import_check() -> str:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "ROBOT_LAB_LOG_LEVEL": "ERROR",
                              "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    otel_loaded, prom_loaded, off = out.stdout.split()[-3:]
    return (f"after a bus publish + handle, tracing off: {off}; prometheus_client imported: {prom_loaded}; "
            f"opentelemetry modules loaded (redis-py and litellm import it when installed): {otel_loaded}")


def hook_ns() -> tuple[float, float]:
    def bare(x: int) -> int:
        return x

    wrapped = otel.traced("bench.noop")(bare)
    n = 200_000
    plain = min(timeit.repeat(lambda: bare(1), number=n, repeat=5)) / n * 1e9
    hooked = min(timeit.repeat(lambda: wrapped(1), number=n, repeat=5)) / n * 1e9
    return plain, hooked


def bus_us(messages: int) -> float:
    r = fakeredis.FakeRedis()
    bus = Bus(redis=r, keys=Keys(prefix="bench"))
    poller = BusPoller("bench", bus, block_ms=0)
    poller.on_message(lambda m: None)
    bus.register("bench")
    started = time.perf_counter()
    for i in range(messages):
        bus.publish("bench", f"m{i}")
    handled = 0
    while handled < messages:
        handled += poller.poll(max_messages=100, block_ms=0)
    return (time.perf_counter() - started) / messages * 1e6


def network_ms(runs: int) -> float:
    net = create_network("bench")
    robot = build("bench-robot", model="scripted/echo")
    net.task("a", robot)
    net.task("b", robot, depends_on="a")
    net.task("c", robot, depends_on="a")
    net.task("d", robot, depends_on=["b", "c"])
    connection = fakeredis.FakeRedis()
    net.run("warm up", connection=connection)
    times = []
    for i in range(runs):
        started = time.perf_counter()
        net.run(f"run {i}", connection=connection)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


_recording = None


def switch(on: bool, provider: object) -> None:
    """Hooks on or off (the bench reaches into the module state; applications cannot turn
    metrics off once enabled)."""
    global _recording
    otel.configure(provider if on else None)
    if on and _recording is None:
        metrics.enable()
        _recording = metrics._m
    metrics._m = _recording if on else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    print("1. nothing configured:", import_check())
    assert otel.tracer() is None and not metrics.enabled()
    plain, hooked = hook_ns()
    print(f"2. one call: bare {plain:.0f} ns, through an otel.traced hook with tracing off {hooked:.0f} ns")

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    network_ms(1)  # imports and warm-up outside the measurements
    results: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for on in (False, True):
            switch(on, provider)
            results.setdefault(("bus", on), []).append(bus_us(args.messages // args.rounds))
            results.setdefault(("net", on), []).append(network_ms(max(args.runs // args.rounds, 1)))
    switch(False, provider)
    spans = len(exporter.get_finished_spans())
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"3. bus, publish + handle: off {med[('bus', False)]:.1f} us/message, on {med[('bus', True)]:.1f} us/message")
    print(f"4. network of 4 tasks (embedded): off {med[('net', False)]:.1f} ms/run, on {med[('net', True)]:.1f} ms/run")
    print(f"   spans recorded while on: {spans}")


if __name__ == "__main__":
    main()
