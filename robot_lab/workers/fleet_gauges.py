"""Prometheus gauges read from Redis at scrape time, and the two ways of serving metrics.

The process counters (messages handled / failed / dead-lettered, handler latency, in-flight,
LLM tokens and cost) are recorded where they happen (``robot_lab/observability/metrics.py``).
What no single process knows -- how deep a robot's queues are, how far its consumer group
lags, what a shared budget has left -- is read from Redis when Prometheus scrapes, by
:class:`RedisCollector`: a few pipelined reads per robot, no state kept between scrapes.

``robot-lab worker --metrics-port`` serves its process counters (with ``--metrics-gauges``
also the per-robot gauges of its own robots); ``robot-lab metrics`` serves these gauges, the
fleet-wide ones included, for every robot, from a process that runs no robot (one per
deployment: gauges from several would be duplicates).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from robot_lab.bus import Bus
from robot_lab.connection import connect, get_redis
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.network.enqueue import queue_name
from robot_lab.observability import metrics
from robot_lab.network.run_state import RUN_FINISHED
from robot_lab.rq_connection import rq_connection
from robot_lab.text.strings import as_str as _s
from robot_lab.workers.fleet_status import known_robots, live_workers, recent_run_statuses

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.metrics")

RUN_STATUSES = ("running", *RUN_FINISHED)  # every series present, so alerts see 0 rather than nothing
BUDGET_SCAN_LIMIT = 1000  # budget hashes read per scrape at most (run-scoped ones expire)


class RedisCollector:
    """A prometheus_client custom collector over one Redis connection."""

    def __init__(self, connection: RedisClient, keys: Keys, robots: list[str] | None = None, *, fleet: bool = True) -> None:
        self.connection = connection
        self.keys = keys
        self.robots = robots  # None: every registered robot, found at each scrape
        # fleet: also the unlabelled fleet-wide gauges (workers live, runs, budgets) -- only
        # the one exporter of a deployment, so sum() over targets never counts them twice
        self.fleet = fleet

    def describe(self) -> list[Any]:
        return []  # no describe-time Redis reads: registering must not need Redis up

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # lazy: start-up time

        bus = Bus(redis=self.connection, keys=self.keys)
        up = GaugeMetricFamily("robot_lab_redis_up", "1 when the last scrape could read Redis")
        try:
            workers = live_workers(self.connection, self.keys)
            # every robot: its inbox, a live worker, or (served by plain rq workers only) its rq queue
            robots = sorted(self.robots if self.robots is not None else
                            known_robots(self.connection, self.keys, workers, []))
            stats = bus.stats(robots)
            queued = self._rq_depths(robots)
            if self.fleet:
                active = int(self.connection.scard(self.keys.runs_active()))
                recent = recent_run_statuses(self.connection, self.keys)
                budgets = list(self._budgets())
        except Exception as exc:  # a scrape must answer even when Redis is down
            log.warning("metrics.redis_unreadable", error=f"{type(exc).__name__}: {exc}")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily("robot_lab_queue_depth", "Work waiting per robot: bus inbox entries not yet "
                                  "delivered (queue=bus) and rq task jobs queued (queue=tasks)", labels=["robot", "queue"])
        lag = GaugeMetricFamily("robot_lab_stream_lag", "Inbox entries not yet read by the robot's consumer group",
                                labels=["robot"])
        pending = GaugeMetricFamily("robot_lab_stream_pending", "Inbox entries delivered but not acked",
                                    labels=["robot"])
        dlq = GaugeMetricFamily("robot_lab_dlq_size", "Dead letters waiting in the robot's DLQ", labels=["robot"])
        for row in stats:
            undelivered = row.lag if row.lag is not None else max(row.length - row.pending, 0)
            depth.add_metric([row.robot, "bus"], undelivered)
            lag.add_metric([row.robot], undelivered)
            pending.add_metric([row.robot], row.pending)
            dlq.add_metric([row.robot], row.dlq)
        for robot, count in queued.items():
            depth.add_metric([robot, "tasks"], count)
        yield from (depth, lag, pending, dlq)
        if not self.fleet:
            return
        live = GaugeMetricFamily("robot_lab_workers_live", "robot-lab workers with a live heartbeat serving the "
                                 "robot (a worker of several robots counts for each)", labels=["robot"])
        for robot in robots:  # 0 included: work queued for a robot with no worker is an alert
            live.add_metric([robot], sum(robot in (w.get("robots") or []) for w in workers))
        runs = GaugeMetricFamily("robot_lab_runs_active", "Network runs not finished yet")
        runs.add_metric([], active)
        finished = GaugeMetricFamily("robot_lab_runs_recent", "Network runs started in the last hour, by status "
                                     "(completed_with_errors: a task failed)", labels=["status"])
        for status in RUN_STATUSES:
            finished.add_metric([status], len(recent.get(status, [])))
        remaining = GaugeMetricFamily("robot_lab_budget_remaining", "What a shared budget has left "
                                      "(limit - consumed - reserved)", labels=["scope", "dimension"])
        for scope, dimension, value in budgets:
            remaining.add_metric([scope, dimension], value)
        waiting = GaugeMetricFamily("robot_lab_inputs_pending", "Input requests of parked runs waiting for a "
                                    "person's answer (docs/durable.md)")
        waiting.add_metric([], int(self.connection.zcard(self.keys.inputs_pending())))
        yield from (live, runs, finished, remaining, waiting)

    def _rq_depths(self, robots: list[str]) -> dict[str, int]:
        from rq import Queue  # lazy: start-up time

        rq = rq_connection(self.connection)
        pipe = rq.pipeline(transaction=False)
        for robot in robots:
            pipe.llen(Queue(queue_name(robot), connection=rq).key)
        return {robot: int(n) for robot, n in zip(robots, pipe.execute())}

    def _budgets(self) -> Iterator[tuple[str, str, float]]:
        prefix = self.keys.budget("")
        keys = []
        for key in self.connection.scan_iter(match=prefix + "*", count=500):
            keys.append(_s(key))
            if len(keys) >= BUDGET_SCAN_LIMIT:
                break
        if not keys:
            return
        pipe = self.connection.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        for key, fields in zip(keys, pipe.execute()):
            values: dict[str, dict[str, float]] = {"limit": {}, "consumed": {}, "reserved": {}}
            for name, raw in fields.items():
                kind, _, dimension = _s(name).partition(":")
                if kind in values:
                    try:
                        values[kind][dimension] = float(_s(raw))
                    except ValueError:
                        continue
            scope = key[len(prefix):].strip("{}")
            for dimension, limit in values["limit"].items():
                used = values["consumed"].get(dimension, 0.0) + values["reserved"].get(dimension, 0.0)
                yield scope, dimension, max(limit - used, 0.0)


def prepare_worker_metrics(concurrency: int) -> None:
    """Before anything imports prometheus_client: with forked rq children, switch to
    prometheus_client's multiprocess mode in a private directory (removed at exit)."""
    metrics.require()
    if concurrency > 1 and not metrics.multiprocess_dir():
        if "prometheus_client" in sys.modules:
            raise ConfigurationError("set PROMETHEUS_MULTIPROC_DIR before prometheus_client is imported")
        path = tempfile.mkdtemp(prefix="robot-lab-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        atexit.register(shutil.rmtree, path, True)


def serve_worker_metrics(port: int, robots: list[str], *, connection: RedisClient | None = None, keys: Keys | None = None,
                         addr: str = metrics.DEFAULT_ADDR, gauges: bool = False) -> Any:
    """``robot-lab worker --metrics-port``: this worker's counters; with ``gauges`` also its
    robots' Redis gauges (robot-labelled). Never the fleet-wide ones: every worker would
    export the same series, and ``sum()`` over targets would count them once per worker."""
    metrics.enable()
    collectors = []
    if gauges:

        collectors.append(RedisCollector(connection or get_redis(), keys or default_keys(), robots or None,
                                         fleet=False))
    served = metrics.serve(port, collectors, addr=addr)
    log.info("metrics.serving", port=port, addr=addr, gauges=gauges, multiprocess=bool(metrics.multiprocess_dir()))
    return served


def start_worker_metrics(port: int, robots: list[str], *, concurrency: int, url: str | None = None,
                         addr: str = metrics.DEFAULT_ADDR, gauges: bool = False) -> Any:
    """What ``robot-lab worker --metrics-port`` does before starting its robots."""
    prepare_worker_metrics(concurrency)
    return serve_worker_metrics(port, robots, connection=connect(url) if url else None, addr=addr, gauges=gauges)
