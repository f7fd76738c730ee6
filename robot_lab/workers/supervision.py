"""Loop supervision for ``robot-lab worker``: every long-running loop of a worker process
(each bus poller thread, the sweeper, the spawn watcher, the rq loop, the rq child
processes) is registered here *before* it starts, reports progress while it runs, and rides
out Redis outages instead of dying.

* :class:`Loop` -- one loop: when it last made progress, whether it is inside a unit of work
  (and for how long that may take), whether its thread died and of what. ``problem()`` says
  why the loop is not serving, or None.
* :class:`Loops` -- the registry of one process; ``problem()`` names every dead or stuck
  loop (the worker heartbeat in :mod:`.health` writes it into the probe's file, so
  ``robot-lab health`` fails naming it, from start-up on).
* :func:`supervise_poller` -- wraps one BusPoller's ``poll`` so each round counts as progress
  and a Redis outage is one ``redis.lost`` / ``redis.back`` pair of lines (capped exponential
  backoff with jitter, see :mod:`robot_lab.outage`) instead of a dead thread.
* :class:`RidesOutages` -- rq worker mixin: rq's own failure path raises ``ConnectionError``
  out of ``work()`` (and logs a traceback); these overrides keep the loop up through an
  outage and put a job that an outage interrupted back on its queue.
* :func:`stop_signalled` / :func:`on_the_way_out` -- a stop signal starts the process's
  :data:`STOP_BUDGET`: the stop path's Redis bookkeeping (rq's worker record, the health
  record) and its idle loops get that long in all, so a Redis that does not answer (down,
  hung, partitioned) never holds a stopping process; what was not written expires with its
  TTL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.outage import OutageTracker, describe, is_outage

log = get_logger("robot_lab.worker")

STARTING = "starting: "  # problem prefix of a loop that has not made progress yet (not an error)
STARTUP_LIMIT = 180.0  # a registered loop must report progress within this (imports, warm-up)
FAILING_LIMIT = 30.0  # a loop whose rounds keep failing (not an outage) for this long is unhealthy
PUBSUB_WAKE = 1.0  # seconds: how long rq's command listener may wait before it sees a stop
# Seconds from a stop signal within which a worker with nothing in hand is gone, whatever
# Redis does: its bookkeeping writes and its idle loops share this budget (see on_the_way_out).
STOP_BUDGET = 3.0
_stop_deadline: float | None = None  # set by the first stop signal of the process (stop_signalled)


def stop_signalled(path: str, jobs: int) -> None:
    """A stop signal arrived: log which path the stop takes (``drain``: jobs in hand finish
    first; ``idle``: nothing to wait for) and start the process's :data:`STOP_BUDGET`."""
    global _stop_deadline
    if _stop_deadline is None:
        _stop_deadline = time.monotonic() + STOP_BUDGET
    log.info("worker.stopping", path=path, jobs=jobs)


def stop_time_left() -> float | None:
    """Seconds left of the stop budget (None: no stop signal yet, nothing is hurried). Jobs
    in hand are waited for outside it: the budget starts again once they are done."""
    if _stop_deadline is None:
        return None
    return max(0.0, _stop_deadline - time.monotonic())


def restart_stop_budget() -> None:
    """The jobs in hand are done (a drain): the idle part of the stop gets its full budget."""
    global _stop_deadline
    if _stop_deadline is not None:
        _stop_deadline = time.monotonic() + STOP_BUDGET


def on_the_way_out(what: str, write: Callable[[], Any]) -> bool:
    """Run ``write`` (bookkeeping of a stopping process: rq's worker record, the health
    record); True when it ended. After a stop signal it runs on a daemon thread and is
    waited for only while the stop budget lasts: the Redis client has no socket timeout,
    so one SIGTERM to an idle worker whose Redis hung or was partitioned away left it alive
    for minutes. What is not written expires with its TTL (rq's worker key, the health
    record); the thread left behind dies with the process. Without a stop signal (a burst
    run, a test) it runs here, as before."""
    left = stop_time_left()
    if left is None:
        write()
        return True

    def run() -> None:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - bookkeeping; the stop goes on
            log.warning("worker.stop_write_failed", what=what, error=describe(exc))

    thread = threading.Thread(target=run, name=f"stop-{what}", daemon=True)
    thread.start()
    thread.join(max(left, 0.05))
    if thread.is_alive():
        log.warning("worker.stop_write_skipped", what=what,
                    reason="Redis did not answer within the stop budget; the record expires with its TTL")
        return False
    return True


class Loop:
    """Progress of one supervised loop (see the module docstring)."""

    def __init__(self, name: str, *, idle_limit: float, busy_limit: float | None = None,
                 start_limit: float = STARTUP_LIMIT, probe: Callable[[], Any] | None = None) -> None:
        self.name = name
        self.idle_limit = float(idle_limit)
        self.busy_limit = busy_limit
        self.start_limit = start_limit
        self.created = time.monotonic()
        self.last: float | None = None
        self.busy_since: float | None = None
        self.busy_what = ""
        self.error: str | None = None
        self.failing: str | None = None
        self.failing_since = 0.0
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.probe = probe  # a value whose change counts as progress
        self.checks: list[Callable[[], str | None]] = []  # more reasons it may not serve
        self._probed: Any = probe() if probe is not None else None
        self.outage = OutageTracker(name)

    def tick(self) -> None:
        self.last = time.monotonic()

    @contextmanager
    def busy(self, what: str, limit: float | None = None) -> Iterator[None]:
        """Inside a unit of work that may take up to ``limit`` (default ``busy_limit``)."""
        self.tick()
        self.busy_since, self.busy_what = time.monotonic(), what
        saved, self.busy_limit = self.busy_limit, self.busy_limit if limit is None else limit
        try:
            yield
        finally:
            self.busy_since, self.busy_limit = None, saved
            self.tick()

    def succeeded(self) -> None:
        self.failing = None
        self.outage.back()

    def failed(self, exc: BaseException) -> None:
        if self.failing is None:
            self.failing_since = time.monotonic()
        self.failing = describe(exc)

    def died(self, why: str) -> None:
        self.error = why

    def problem(self, now: float | None = None) -> str | None:
        """Why this loop is not serving, or None."""
        now = time.monotonic() if now is None else now
        if self.error:
            return f"{self.name} died: {self.error}"
        if self.thread is not None and not self.thread.is_alive() and not self.stopping:
            return f"{self.name} is not running"
        for check in self.checks:
            if found := check():
                return found
        if self.probe is not None:
            value = self.probe()
            if value != self._probed:
                self._probed = value
                self.tick()
        if self.failing and now - self.failing_since > FAILING_LIMIT:
            return f"{self.name} failing for {now - self.failing_since:.0f}s: {self.failing}"
        if self.busy_since is not None:
            since = max(self.busy_since, self.last or 0.0)
            if self.busy_limit is not None and now - since > self.busy_limit:
                return (f"{self.name} stuck: {self.busy_what} without progress for {now - since:.0f}s "
                        f"(limit {self.busy_limit:.0f}s)")
            return None
        if self.last is None:
            if now - self.created > self.start_limit:
                return f"{self.name} did not start within {self.start_limit:.0f}s"
            return f"{STARTING}{self.name}"
        if now - self.last > self.idle_limit:
            return f"{self.name} stuck: no progress for {now - self.last:.0f}s (limit {self.idle_limit:.0f}s)"
        return None

    def state(self) -> str:
        if self.error or (self.thread is not None and not self.thread.is_alive() and not self.stopping):
            return "dead"
        if self.outage.down:
            return "redis-down"
        if self.last is None:
            return "starting"
        return "busy" if self.busy_since is not None else "idle"


class Loops:
    """The supervised loops (and extra checks) of one worker process."""

    def __init__(self) -> None:
        self.loops: dict[str, Loop] = {"start-up": Loop("start-up", idle_limit=float("inf"))}
        self.checks: list[Callable[[], str | None]] = []
        self.extra_info: Callable[[], dict[str, Any]] | None = None  # e.g. the rq loop's job in hand
        self._lock = threading.Lock()

    def add(self, name: str, **limits: Any) -> Loop:
        loop = Loop(name, **limits)
        with self._lock:
            self.loops[name] = loop
        return loop

    def thread(self, loop: Loop, target: Callable[..., Any], *args: Any, stop: threading.Event) -> threading.Thread:
        """A daemon thread running ``target(*args)`` under ``loop``'s supervision: if it
        raises or returns while the worker still runs, the loop is recorded dead (one
        traceback in the log) and the health probe fails naming it."""

        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - recorded for the probe, then the thread ends
                loop.died(describe(exc))
                log.error("worker.loop_died", loop=loop.name, error=describe(exc), exc_info=True)
                return
            if not stop.is_set():
                loop.died("returned while the worker was running")
                log.error("worker.loop_died", loop=loop.name, error="returned")

        loop.thread = threading.Thread(target=run, name=loop.name, daemon=True)
        return loop.thread

    def started(self) -> None:
        """Every loop is registered: drop the ``start-up`` placeholder that kept the probe
        failing while the worker imported and warmed up."""
        with self._lock:
            self.loops.pop("start-up", None)

    def stopping(self) -> None:
        for loop in list(self.loops.values()):
            loop.stopping = True

    def problem(self) -> str | None:
        """Every dead or stuck loop (and failed check), joined; None when all serve."""
        problems = [p for loop in list(self.loops.values()) if (p := loop.problem())]
        problems += [p for check in self.checks if (p := check())]
        # real problems first: "starting: ..." alone means the worker is not serving *yet*
        problems.sort(key=lambda p: p.startswith(STARTING))
        return "; ".join(problems) or None

    def info(self) -> dict[str, Any]:
        return {"loops": {name: loop.state() for name, loop in list(self.loops.items())}}


def supervise_poller(poller: Any, loop: Loop, stop: threading.Event, *,
                     handler_limit: float) -> Any:
    """Make ``poller.poll`` report to ``loop`` and ride out Redis outages (see the module
    docstring). Entries resolved (``poller.counts``) count as progress, so a round that
    handles many messages is not mistaken for a stuck one; one handler may run up to
    ``handler_limit`` seconds."""
    original = poller.poll
    loop.probe = lambda: sum(poller.counts.values())
    loop._probed = loop.probe()  # only a change is progress

    def poll(*args: Any, **kwargs: Any) -> int:
        with loop.busy("handling the inbox", handler_limit):
            try:
                done = original(*args, **kwargs)
            except Exception as exc:
                if not is_outage(exc):
                    loop.failed(exc)
                    raise
                loop.outage.lost(exc)
                loop.outage.pause(stop)
                return 0
        loop.succeeded()
        return int(done or 0)

    poller.poll = poll
    loop.checks.append(lambda: _wrong_type_keys(loop.name, poller))
    # A round counts as progress from its start, so without this the probe said "ok" during
    # a first round whose consumer group cannot be created, before the poller named the key.
    loop.checks.append(lambda: None if getattr(poller, "registered", True) else f"{STARTING}{loop.name}")
    if getattr(poller, "in_flight", 1) > 1:  # handlers run on the poller's threads, not in poll()
        loop.checks.append(lambda: _stuck_handler(loop.name, poller, handler_limit))
    return poller


def _wrong_type_keys(name: str, poller: Any) -> str | None:
    problems = getattr(poller, "key_problems", None)
    return f"{name}: {'; '.join(problems)} (delete or rename the key)" if problems else None


def _stuck_handler(name: str, poller: Any, limit: float) -> str | None:
    age = poller.longest_running()
    if age > limit:
        return f"{name} stuck: a handler running for {age:.0f}s (limit {limit:.0f}s)"
    return None


class _ReconnectNoise(logging.Filter):
    """rq logs an error line per reconnect attempt; the outage tracker's lost/back lines
    replace them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "could not connect to Redis instance" not in str(record.msg)


logging.getLogger("rq.worker").addFilter(_ReconnectNoise())


class RidesOutages:
    """rq worker mixin: stay up through a Redis outage (restart, failover), and stop without
    waiting on a Redis that does not answer.

    The heartbeat at the top of every dequeue round waits for Redis (backoff with jitter,
    one lost/back pair of log lines); state writes and registry maintenance are skipped
    while Redis is away; a job interrupted by the outage is put back on its queue once Redis
    is back (the job function is idempotent: a task already done or taken over by another
    worker after its lease expired is not run twice).
    """

    outage: OutageTracker
    loop_beat: float
    _state_written: str | None = None  # the worker state last written (workers that skip rewrites)

    def _tracker(self) -> OutageTracker:
        tracker = getattr(self, "outage", None)
        if tracker is None:
            tracker = self.outage = OutageTracker(f"rq {getattr(self, 'name', '')}".strip())
        return tracker

    def _ride_out(self, fn: Callable[[], Any]) -> Any:
        def retrying() -> None:
            self.loop_beat = time.monotonic()  # reconnecting is progress, not a wedged loop
            if getattr(self, "_stop_requested", False):
                from rq.exceptions import StopRequested  # lazy: start-up time

                raise StopRequested()

        return self._tracker().call(fn, on_retry=retrying)

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pipeline") is not None:
            return super().heartbeat(*args, **kwargs)  # type: ignore[misc]
        return self._ride_out(lambda: super(RidesOutages, self).heartbeat(*args, **kwargs))  # type: ignore[misc]

    def dequeue_job_and_maintain_ttl(self, timeout: Any, max_idle_time: Any = None) -> Any:
        # rq retries its blocking pop on a lost connection only; Redis out of memory (BLMOVE
        # is refused) would end work() with a traceback
        return self._ride_out(lambda: super(RidesOutages, self).dequeue_job_and_maintain_ttl(  # type: ignore[misc]
            timeout, max_idle_time))

    def check_for_suspension(self, burst: bool) -> Any:
        return self._ride_out(lambda: super(RidesOutages, self).check_for_suspension(burst))  # type: ignore[misc]

    def set_state(self, state: str, pipeline: Any = None) -> Any:
        try:
            return super().set_state(state, pipeline=pipeline)  # type: ignore[misc]
        except Exception as exc:
            if not is_outage(exc):
                raise
            self._state = state  # the Redis copy is cosmetic; the next round writes it again
            self._state_written = None  # (a worker that writes only changes: write it again)
            self._tracker().lost(exc)
            return None

    def run_maintenance_tasks(self) -> Any:
        try:
            return super().run_maintenance_tasks()  # type: ignore[misc]
        except Exception as exc:
            if not is_outage(exc):
                raise
            self._tracker().lost(exc)  # registry cleaning can wait for the next round
            return None

    def execute_job(self, job: Any, queue: Any) -> Any:
        try:
            return super().execute_job(job, queue)  # type: ignore[misc]
        except Exception as exc:
            if not is_outage(exc):
                raise
            self._state_written = None  # the job's end (state idle) may not have been written
            self._tracker().lost(exc)
            log.warning("worker.job_interrupted", job_id=job.id, queue=queue.name, error=describe(exc))
            self._ride_out(lambda: _requeue_interrupted(job, queue))
            return None

    def jobs_in_hand(self) -> int:
        """Jobs this worker runs now (rq's one, when it says it is busy)."""
        from rq.worker import WorkerStatus  # lazy: start-up time

        return int(self.get_state() == WorkerStatus.BUSY)  # type: ignore[attr-defined]

    def request_stop(self, signum: int, frame: Any) -> None:
        """rq's warm-shutdown signal handler, saying which path the stop takes and starting
        the stop budget (:func:`stop_signalled`): after it nothing waits on Redis."""
        jobs = self.jobs_in_hand()
        stop_signalled("drain" if jobs else "idle", jobs)
        super().request_stop(signum, frame)  # type: ignore[misc]

    def teardown(self) -> Any:
        """rq's teardown (the worker's death in its records), never waiting on Redis:
        stopping while Redis is away or hung, its worker key expires (:func:`on_the_way_out`)."""
        restart_stop_budget()  # the jobs in hand are done by now
        try:
            on_the_way_out("rq-worker-record", super().teardown)  # type: ignore[misc]
        except Exception as exc:
            if not is_outage(exc):
                raise
            self._tracker().lost(exc)  # stopping while Redis is away: its worker key expires

    def set_shutdown_requested_date(self) -> None:
        """rq writes the date of a warm shutdown to the worker's hash from the signal
        handler; on a thread here, not waited for: a handler blocked on a hung Redis
        kept the worker from stopping at all."""
        threading.Thread(target=self._write_shutdown_date, name="stop-shutdown-date", daemon=True).start()

    def _write_shutdown_date(self) -> None:
        try:
            super().set_shutdown_requested_date()  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - cosmetic in Redis; stopping matters
            log.warning("worker.shutdown_date_failed", error=describe(exc))

    def subscribe(self) -> None:
        """rq's subscription to the worker's command channel (``rq`` suspend/stop commands),
        its listener thread waking every ``PUBSUB_WAKE`` s rather than rq's 60.

        rq's teardown unsubscribes, then stops the listener; redis-py 8's ``stop()`` waits
        for the thread to end. A listener that read the unsubscribe reply before the stop
        went back to waiting for a subscription -- for its whole wake interval -- so a worker
        whose jobs were done took a minute to exit after SIGTERM or to return from a burst
        run (and results kept for 60 s were gone by then)."""
        self.pubsub = self.connection.pubsub()  # type: ignore[attr-defined]
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})  # type: ignore[attr-defined]
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_WAKE, daemon=True, exception_handler=self._pubsub_exception_handler)

    def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
        if not is_outage(exc):
            return super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)  # type: ignore[misc]
        time.sleep(self._tracker().backoff.next_delay())  # the main loop reports the outage
        return None


def _requeue_interrupted(job: Any, queue: Any) -> None:
    """Put an rq job whose execution an outage cut short back on its queue (unless it
    finished after all): out of the started registry, status queued, id pushed again."""
    from rq.job import JobStatus  # lazy: start-up time

    status = job.get_status(refresh=True)
    if status in (JobStatus.FINISHED, JobStatus.QUEUED, None):
        return
    queue.started_job_registry.remove_executions(job)
    queue.enqueue_job(job)
    log.warning("worker.job_requeued", job_id=job.id, queue=queue.name, was=str(status))
