"""Prometheus metrics of one process, a no-op until :func:`enable` is called.

``robot-lab worker --metrics-port`` enables them (so do ``robot-lab metrics`` and any
application that calls ``enable()``); until then every hook is one global check. The
counters live in prometheus_client's default registry, or -- when ``PROMETHEUS_MULTIPROC_DIR``
is set before prometheus_client is first imported -- in its multiprocess files, which is how
``robot-lab worker --concurrency N`` adds its forked children up behind one port
(docs/observability.md).

Labels are robot and model names, never message contents or ids: a label per message would
grow the series without bound.
"""

from __future__ import annotations

import contextvars
import importlib.util
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from robot_lab.errors import ConfigurationError

_m: Any = None  # the metric objects once enabled, else None

# Where /metrics listens unless --metrics-addr widens it: loopback, like the dashboard. The
# counters name robots and models; a pod (deploy/k8s) passes --metrics-addr 0.0.0.0.
DEFAULT_ADDR = "127.0.0.1"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Metrics:
    """The process's metric objects (created once: prometheus_client refuses duplicates)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram  # lazy: start-up time

        self.handled = Counter("robot_lab_messages_handled", "Bus messages handled and acked", ["robot"])
        self.failed = Counter("robot_lab_messages_failed", "Bus message handlings that failed (nacked)", ["robot"])
        self.dead = Counter("robot_lab_messages_dead_lettered", "Bus messages moved to the DLQ", ["robot", "reason"])
        self.latency = Histogram("robot_lab_handler_seconds", "Bus handler latency", ["robot"],
                                 buckets=LATENCY_BUCKETS)
        self.in_flight = Gauge("robot_lab_messages_in_flight", "Bus messages being handled now", ["robot"],
                               multiprocess_mode="livesum")
        self.tasks = Counter("robot_lab_tasks", "Network tasks finished by this process", ["robot", "outcome"])
        self.task_seconds = Histogram("robot_lab_task_seconds", "Network task duration in this process (the "
                                      "robot's run, claim to result)", ["robot", "outcome"], buckets=LATENCY_BUCKETS)
        self.llm_calls = Counter("robot_lab_llm_calls", "Model calls", ["robot", "model", "outcome"])
        self.tokens = Counter("robot_lab_llm_tokens", "Model tokens", ["robot", "model", "direction"])
        self.cost = Counter("robot_lab_llm_cost_usd", "Model cost in USD (litellm's price table)", ["robot", "model"])
        self.wrong_type = Counter("robot_lab_bus_wrong_type_keys", "Times a bus poller found one of its robot's keys "
                                  "of the wrong type (it keeps polling)", ["robot"])


def enable() -> bool:
    """Start recording in this process; False when prometheus_client is not installed."""
    global _m
    if _m is None:
        try:
            _m = _Metrics()
        except ImportError:
            return False
    return True


def enabled() -> bool:
    return _m is not None


def require() -> None:
    """Raise a clear error when the metrics extra is missing (for the CLI). Finds the module
    without importing it: multiprocess mode must be chosen before the first import."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigurationError(
            "metrics need prometheus_client: pip install 'robot-lab[metrics]'"
        ) from None


def _robot_label() -> str:
    from robot_lab.logging import log_context_values  # lazy: start-up time

    return str(log_context_values().get("robot") or "-")


# --- hooks ------------------------------------------------------------------------------

class _Handling:
    """Times one bus delivery and counts its outcome from the delivery's final state."""

    __slots__ = ("robot", "delivery", "started")

    def __init__(self, robot: str, delivery: Any) -> None:
        self.robot = robot
        self.delivery = delivery
        self.started = 0.0

    def __enter__(self) -> _Handling:
        _m.in_flight.labels(self.robot).inc()
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        _m.latency.labels(self.robot).observe(time.perf_counter() - self.started)
        _m.in_flight.labels(self.robot).dec()
        state = getattr(self.delivery, "state", None)
        if state == "acked":
            _m.handled.labels(self.robot).inc()
        elif state == "nacked" or exc_type is not None:  # a failure that goes straight to the
            _m.failed.labels(self.robot).inc()           # DLQ is counted by dead_lettered()


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NOTHING = _Nothing()


def handling(robot: str, delivery: Any) -> _Handling | _Nothing:
    """``with handling(robot, delivery):`` around a bus handler (in-flight, latency, outcome)."""
    return _NOTHING if _m is None else _Handling(robot, delivery)


HANDLER_FAILURES = ("failed", "rejected")  # DLQ reasons that are the handler's own outcome


def dead_lettered(robot: str, reason: str) -> None:
    """Count a dead letter; one whose handler failed (its last delivery, or a rejection) is
    also a failed handling."""
    if _m is not None:
        _m.dead.labels(robot, reason).inc()
        if reason in HANDLER_FAILURES:
            _m.failed.labels(robot).inc()


def wrong_type_key(robot: str) -> None:
    if _m is not None:
        _m.wrong_type.labels(robot).inc()


def task_finished(robot: str, failed: bool, seconds: float | None = None) -> None:
    if _m is not None:
        outcome = "failed" if failed else "done"
        _m.tasks.labels(robot, outcome).inc()
        if seconds is not None:
            _m.task_seconds.labels(robot, outcome).observe(seconds)


_uncounted: contextvars.ContextVar[bool] = contextvars.ContextVar("robot_lab_uncounted", default=False)


@contextmanager
def uncounted() -> Iterator[None]:
    """No model call inside this block is counted: a worker's warm-up call at start is no
    one's call, and would add one ``robot="-"`` call per worker start."""
    token = _uncounted.set(True)
    try:
        yield
    finally:
        _uncounted.reset(token)


def llm_call(model: str, response: Any, error: BaseException | None = None) -> None:
    """Count a model call; ``response`` is an LLMResponse (tokens and cost) or None."""
    if _m is None or _uncounted.get():
        return
    robot = _robot_label()
    _m.llm_calls.labels(robot, model, "error" if error is not None else "ok").inc()
    if response is None:
        return
    _m.tokens.labels(robot, model, "input").inc(int(getattr(response, "input_tokens", 0) or 0))
    _m.tokens.labels(robot, model, "output").inc(int(getattr(response, "output_tokens", 0) or 0))
    _m.cost.labels(robot, model).inc(float(getattr(response, "cost", 0.0) or 0.0))


# --- serving ----------------------------------------------------------------------------

def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def registry(collectors: Iterable[Any] = ()) -> Any:
    """The registry to expose: this process's metrics (or every process's, in multiprocess
    mode) plus ``collectors`` (e.g. the Redis gauges of workers/fleet_gauges.py)."""
    from prometheus_client import REGISTRY, CollectorRegistry  # lazy: start-up time

    path = multiprocess_dir()
    if path:
        from prometheus_client import multiprocess  # lazy: start-up time

        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path=path)
    elif collectors:
        reg = CollectorRegistry()
        reg.register(_Forward(REGISTRY))
    else:
        return REGISTRY
    for collector in collectors:
        reg.register(collector)
    return reg


class _Forward:
    """Exposes the default registry's metrics inside another registry."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterable[Any]:
        return self.source.collect()


def serve(port: int, collectors: Iterable[Any] = (), addr: str = DEFAULT_ADDR) -> Any:
    """Serve ``/metrics`` on ``port`` from a daemon thread; returns (server, thread)."""
    from prometheus_client import start_http_server  # lazy: start-up time

    try:
        return start_http_server(port, addr=addr, registry=registry(collectors))
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None
