"""In flight: one ``robot-lab worker`` process runs many tasks and messages at once.

A robot spends almost all of a run waiting for its model (seconds per call, on the network),
so a process that runs one thing at a time is mostly idle. ``robot-lab worker --in-flight N``
(setting ``worker.in_flight``, default 16) runs up to N network tasks, and up to N bus
messages per served robot, at once, each on a thread of its own. Threads are the simplest
honest design here: model calls and Redis round trips release the GIL, the robot runtime is
synchronous code, and Dramatiq makes the same choice (8 threads per process by default).

**Network tasks** -- :class:`InFlightWorker` (built by :func:`in_flight_worker_class`): one rq
``SimpleWorker`` whose work loop takes jobs only when one of its N slots is free and runs
each on a pool thread (started on demand, :mod:`robot_lab.threads`; one pool per process, shared
with the bus pollers, so a burst's threads serve the next one's work). rq 3 models a worker
with several executions (``Execution`` objects in the worker's executions set); network task
jobs run on the lean lifecycle of :mod:`.task_lifecycle` (rq's records ride with the task's
claim and its result, rq's own failure handling), any other job through rq's
``perform_job``. A job taken is *held* (``R:held:<task>``, beaten by the lease keeper) until
it ends, so a sweep never takes one waiting here for a thread for stranded. Each job claims
its task and keeps its own lease (:mod:`robot_lab.network.task_job`,
:mod:`robot_lab.network.lease`: one keeper thread beats every lease of the process in one
pipelined round trip), so after a kill -9 every task in hand is re-run when its lease
expires, and budgets (Redis ledgers, holds per job attempt and thread) and a network's
``max_concurrent_robots`` (enforced when tasks are enqueued) hold as with N processes. Job
timeouts use rq's ``TimerDeathPenalty`` mechanism on one watchdog thread (:mod:`.timeouts`):
SIGALRM works only in the main thread.

SIGTERM (rq's warm shutdown): the loop takes nothing new, the jobs in hand finish, then rq
tears the worker down. A second signal is rq's cold shutdown (the jobs in hand are left to
their leases). The unmodified ``rq worker robot:<name>`` still runs one job at a time.

**Bus messages** -- ``BusPoller(in_flight=N)`` (:mod:`robot_lab.bus.handling`) reads only as
many entries as it has free slots, runs handlers of different conversations at once, keeps
one conversation in order across every consumer (conversation heads, ACQUIRE) and heart-beats
every entry in hand. A Robot object holds the conversation of the run in hand, so
:class:`RobotPool` gives each concurrent run a robot of its own, built from the same spec.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
import sys
import threading
import time
import typing
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.outage import is_outage
from robot_lab.rq_connection import data_connection
from robot_lab.settings import get_settings
from robot_lab.threads import PoolShare
from robot_lab.workers.health import JOB_SLACK, LOOP_SLACK
from robot_lab.workers.supervision import RidesOutages

if TYPE_CHECKING:
    from robot_lab.runtime.robot import Robot

log = get_logger("robot_lab.worker")

SLOT_WAIT = 1.0  # seconds between worker heartbeats while every slot is taken
# rq beats its worker key (3 commands) several times per job from the loop that takes jobs;
# with jobs running on other threads each round trip of that loop also waits for the GIL, so
# the loop beats at most this often (the key lives worker_ttl + 60 s) and checks rq's
# suspension flag as often.
LOOP_BEAT_INTERVAL = 1.0
# Free slots are filled by one pipelined batch of pops (and one of job fetches) instead of a
# blocking pop per job: the loop that takes jobs shares the GIL with every running job, so a
# round trip per job made it the bottleneck of a wide fan-out (bench/concurrency.py).
DEQUEUE_BATCH = 64


class RobotPool:
    """Robots of one spec for concurrent runs: a run takes a free robot (or builds one) and
    gives it back after. A Robot keeps the conversation of its run on itself, so one object
    must not run two messages at once; at most ``in_flight`` robots are ever built.

    Messages without a ``conversation_id`` continue the in-process default conversation of
    whichever robot of the pool runs them (a conversation id is what makes a conversation
    continue on any slot of any worker)."""

    concurrent_runs = True  # BusPoller.serve: safe to call from several threads at once

    def __init__(self, spec: Any, build: Callable[[], Any] | None = None) -> None:
        if build is None:
            from robot_lab.runtime.robot import Robot  # lazy: start-up time

            def build() -> Any:
                return Robot.from_spec(spec)

        self.spec = spec
        self._build = build
        self._prototype = build()
        self._free: list[Any] = [self._prototype]
        self._lock = threading.Lock()
        self.built = 1

    @property
    def name(self) -> str:
        return str(self._prototype.name)

    def _take(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.built += 1
        return self._build()

    def _give(self, robot: Robot) -> None:
        with self._lock:
            self._free.append(robot)

    def run(self, message: str | None = None, *, conversation_id: str | None = None,
            attachments: Iterable[Any] | None = None, **kwargs: Any) -> Any:
        """``Robot.run`` on a robot of the pool nobody else is using now."""
        robot = self._take()
        try:
            # one MCP connection per server for all the slots (a pool may hold any robot-like object)
            shared = getattr(robot, "shared_mcp", None)
            with shared() if shared is not None else contextlib.nullcontext():
                return robot.run(message, conversation_id=conversation_id, attachments=attachments, **kwargs)
        finally:
            self._give(robot)

    def serve_policy(self, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """What a served run offers (the spec's tools and MCP servers, narrowed by headers)."""
        return dict(self._prototype.serve_policy(headers))


def in_flight_worker_class() -> type:
    """The rq worker class of ``robot-lab worker --in-flight N`` (N > 1); see the module
    docstring. Built on first use: rq is imported lazily."""
    from rq.exceptions import StopRequested  # lazy: start-up time
    from rq.worker import SimpleWorker, WorkerStatus  # lazy: start-up time

    from robot_lab.workers.timeouts import SharedTimerDeathPenalty  # lazy: start-up time
    from robot_lab.network.job_policy import PolicedWorker  # lazy: start-up time
    from robot_lab.workers.task_lifecycle import task_job_lifecycle  # lazy: start-up time

    class InFlightWorker(PolicedWorker, RidesOutages, task_job_lifecycle(SimpleWorker)):
        """rq SimpleWorker running up to ``in_flight`` jobs at once on pool threads; runs
        only robot-lab's job (network/job_policy.py)."""

        death_penalty_class = SharedTimerDeathPenalty

        def __init__(self, *args: Any, in_flight: int = 16, on_stop: Callable[[], None] | None = None,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.in_flight = max(1, int(in_flight))
            from robot_lab.network.lease import set_process_slots  # lazy: start-up time

            set_process_slots(self.in_flight)  # leases long enough for this many tasks' GIL turns
            tune_switch_interval(self.in_flight)
            self.on_stop = on_stop
            self.loop_beat = 0.0
            self._jobs: dict[str, tuple[float, float | None]] = {}  # job id -> (started, timeout)
            self._slots = threading.Condition()
            self._pool: Any = None  # a PoolShare of the process pool (robot_lab/threads.py), made when work() starts taking jobs (again)
            self._waiting = False  # the main thread waits for a job or a slot: nothing in hand
            self._cold = False
            self._suspension_checked = 0.0
            self._state_written: str | None = None
            self._taken: deque[tuple[Any, Any]] = deque()  # popped by a batch, not yet running
            self._holds: dict[str, Any] = {}  # job id -> its HeldJobLease (network/lease.py), taken until it ends
            self.jobs_done = 0

        # --- taking jobs --------------------------------------------------------------
        def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
            if self._pool is None:  # a few threads warm, the rest started on demand (robot_lab/threads.py)
                self._pool = PoolShare(self.in_flight, "rq-job")
                tune_gc()
            while True:
                self._wait_for_slot()
                if self._taken:
                    return self._taken.popleft()
                if self.in_flight - len(self._jobs) > 1:
                    try:
                        batch = self._dequeue_batch(min(DEQUEUE_BATCH, self.in_flight - len(self._jobs)))
                    except Exception as exc:
                        if not is_outage(exc):
                            raise
                        self._tracker().lost(exc)  # rq's blocking dequeue below rides it out
                        batch = []
                    if batch:
                        self._taken.extend(batch[1:])
                        return batch[0]
                self._waiting = True
                try:
                    # a SIGTERM taken before _waiting was set only marked the stop (_shutdown):
                    # it must not leave this thread blocked in rq's dequeue for its whole timeout
                    # (minutes; a stop right after start-up hung 5 times in 6 while the first
                    # dequeue tuned the collector)
                    if self._stop_requested:
                        raise StopRequested()
                    result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                finally:
                    self._waiting = False
                if result is not None or timeout is not None or not self._jobs:
                    return result
                # burst and the queues are empty, but jobs in hand may enqueue more (the
                # DAG's next tasks): wait for one to finish, then look again
                with self._slots:
                    if self._jobs:
                        self._slots.wait(SLOT_WAIT)

        def _dequeue_batch(self, limit: int) -> list[tuple[Any, Any]]:
            """Up to ``limit`` jobs off the queues without blocking, in one round trip of pops
            and one of fetches. Each pop is the one rq's ``dequeue_any`` makes (LMOVE into
            the intermediate list for a single queue, LPOP across several), so a job taken
            here is in the same place as one taken by rq, and a crash leaves it where rq's
            intermediate-queue cleanup and the sweeper look."""
            from rq.utils import as_text, get_version  # lazy: start-up time

            queues = list(self._ordered_queues)
            single = len(queues) == 1 and get_version(self.connection) >= (6, 2, 0)
            taken: list[tuple[Any, str]] = []
            try:
                for queue in queues:
                    want = limit - len(taken)
                    if want <= 0:
                        break
                    with self.connection.pipeline(transaction=False) as pipe:
                        for _ in range(want):
                            if single:
                                pipe.lmove(queue.key, queue.intermediate_queue_key)
                            else:
                                pipe.lpop(queue.key)
                        ids = [as_text(i) for i in pipe.execute() if i is not None]
                    taken += [(queue, job_id) for job_id in ids]
                if not taken:
                    return []
                jobs = self.job_class.fetch_many([job_id for _, job_id in taken], connection=self.connection,
                                      serializer=self.serializer)
            except Exception as exc:
                if taken:  # popped but not fetched: rq's and the sweeper's recovery apply
                    log.warning("worker.batch_dequeue_failed", jobs=len(taken),
                                error=f"{type(exc).__name__}: {exc}")
                raise
            version = self.get_redis_server_version()
            result = []
            for (queue, job_id), job in zip(taken, jobs):
                if job is None:  # deleted while queued: rq skips it too
                    continue
                job.redis_server_version = version
                result.append((job, queue))
            if result:
                self.reorder_queues(reference_queue=result[-1][1])
                self._hold([job for job, _ in result])
            return result

        def _hold(self, jobs: list[Any]) -> None:
            """Mark network task jobs as in this live worker's hands (``R:held:<task>``, one
            round trip), so no sweeper takes one waiting here for a thread for stranded."""
            from robot_lab.network.lease import hold_jobs, task_lease_ms  # lazy: start-up time

            holds = [(job.id, key) for job in jobs if job.id not in self._holds
                     for key in [_held_key(job)] if key is not None]
            if not holds:
                return
            try:
                made = hold_jobs(self._data_connection(), [(key, job_id) for job_id, key in holds], task_lease_ms())
            except Exception as exc:  # noqa: BLE001 - a hold is an optimisation of the sweep's patience
                log.warning("worker.hold_failed", jobs=len(holds), error=f"{type(exc).__name__}: {exc}")
                return
            for (job_id, _), hold in zip(holds, made):
                self._holds[job_id] = hold

        def _data_connection(self) -> Any:
            return data_connection(self.connection)

        def _give_back_taken(self) -> None:
            """Jobs popped by a batch that a stop left unstarted go back to the head of their
            queue (and out of the intermediate list), in order."""
            from robot_lab.network.lease import release_holds  # lazy: start-up time

            release_holds([self._holds.pop(job.id) for job, _ in self._taken if job.id in self._holds], ran=False)
            while self._taken:
                job, queue = self._taken.pop()
                with self.connection.pipeline() as pipe:
                    pipe.lpush(queue.key, job.id)
                    pipe.lrem(queue.intermediate_queue_key, 1, job.id)
                    pipe.execute()

        def _wait_for_slot(self) -> None:
            """Block while every slot is taken; beat rq's worker key meanwhile."""
            while True:
                with self._slots:
                    if len(self._jobs) < self.in_flight:
                        return
                    self._waiting = True
                    try:
                        self._slots.wait(SLOT_WAIT)
                    finally:
                        self._waiting = False
                if self._stop_requested:
                    raise StopRequested()
                self.heartbeat()

        def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> Any:
            now = time.monotonic()
            if timeout is None and pipeline is None and now - self.loop_beat < LOOP_BEAT_INTERVAL:
                return None
            if pipeline is None:
                self.loop_beat = now
            return super().heartbeat(timeout, pipeline=pipeline)

        def set_state(self, state: str, pipeline: Any = None) -> Any:
            """rq flips busy/idle around every job; with several jobs at once the worker is
            busy while any runs. Written to Redis only when that changes."""
            effective = WorkerStatus.BUSY if getattr(self, "_jobs", None) else state
            if effective == getattr(self, "_state_written", None):
                self._state = effective
                return None
            self._state_written = effective
            return super().set_state(effective, pipeline=pipeline)

        def check_for_suspension(self, burst: bool) -> Any:
            now = time.monotonic()
            if now - self._suspension_checked < LOOP_BEAT_INTERVAL:
                return None
            self._suspension_checked = now
            return super().check_for_suspension(burst)

        # --- running them ----------------------------------------------------------------
        def execute_job(self, job: Any, queue: Any) -> None:
            timeout = job.timeout if isinstance(job.timeout, (int, float)) and job.timeout > 0 else None
            with self._slots:
                self._jobs[job.id] = (time.monotonic(), timeout)
            self._hold([job])  # taken by rq's own blocking dequeue: not held yet
            if self._pool is None:  # normally made before the first dequeue
                self._pool = PoolShare(self.in_flight, "rq-job")
            self._pool.submit(self._run_job, job, queue)

        def _run_job(self, job: Any, queue: Any) -> None:
            try:
                # RidesOutages.execute_job around SimpleWorker.execute_job: rq's perform_job
                # (prepare the execution, run, record the result or failure)
                super(InFlightWorker, self).execute_job(job, queue)
            except BaseException as exc:  # noqa: BLE001 - a pool thread never dies silently
                log.error("worker.job_thread_failed", job_id=job.id, error=f"{type(exc).__name__}: {exc}")
            finally:
                from robot_lab.network.lease import release_holds  # lazy: start-up time

                hold = self._holds.pop(job.id, None)
                if hold is not None:
                    release_holds([hold])
                with self._slots:
                    self._jobs.pop(job.id, None)
                    self.jobs_done += 1
                    self._slots.notify_all()
                    if not self._jobs:
                        self._idle_now()

        def _idle_now(self) -> None:
            """The last job in hand ended: say ``idle`` to rq (``rq info``, rq-dashboard) now.
            rq's own idle write came while this job still counted, and the main thread may be
            blocked in its dequeue for minutes. Called under ``_slots``, so a job taken
            meanwhile writes its ``busy`` after this."""
            try:
                self.set_state(WorkerStatus.IDLE)
            except Exception as exc:  # cosmetic: the next job's state write corrects it
                log.warning("worker.state_write_failed", error=f"{type(exc).__name__}: {exc}")

        # --- stopping ----------------------------------------------------------------------
        def _shutdown(self) -> None:
            """Warm shutdown (first SIGTERM/SIGINT): take nothing new; the jobs in hand finish
            in ``teardown``. Interrupts the main thread only while it holds no job."""
            self._stop_requested = True
            if self.on_stop is not None:
                self.on_stop()
            self.set_shutdown_requested_date()  # on a thread of its own (RidesOutages)
            if self._waiting:
                raise StopRequested()

        def jobs_in_hand(self) -> int:
            return len(self._jobs)

        def request_force_stop(self, signum: int, frame: Any) -> None:
            self._cold = True
            super().request_force_stop(signum, frame)

        def drain(self) -> None:
            """Wait for every job in hand, beating rq's worker key meanwhile."""
            while True:
                with self._slots:
                    if not self._jobs:
                        return
                    self._slots.wait(SLOT_WAIT)
                try:
                    self.heartbeat()
                except Exception:  # noqa: BLE001 - draining goes on while Redis is away
                    pass

        def teardown(self) -> Any:
            try:
                self._give_back_taken()
            except Exception as exc:  # noqa: BLE001 - Redis away: the sweeper re-enqueues them
                log.warning("worker.give_back_failed", jobs=len(self._taken), error=f"{type(exc).__name__}: {exc}")
            if not self._cold:
                self.drain()
            if self._pool is not None:  # a work() restarted after a Redis outage makes a new one
                self._pool.shutdown(wait=not self._cold)
                self._pool = None
            return super().teardown()

        # --- health (workers/health.py) -------------------------------------------------
        def progress(self) -> dict[str, Any]:
            with self._slots:
                jobs = dict(self._jobs)
            if not jobs:
                return {"state": "idle", "in_flight": 0}
            oldest = min(since for since, _ in jobs.values())
            return {"state": "busy", "in_flight": len(jobs), "busy_for": round(time.monotonic() - oldest, 1)}

        def loop_problem(self) -> str | None:
            """A job past its rq timeout (the death penalty should have stopped it), or a
            work loop that stopped coming around."""
            now = time.monotonic()
            with self._slots:
                jobs = dict(self._jobs)
            for job_id, (since, timeout) in jobs.items():
                if timeout is not None and now - since > timeout + JOB_SLACK:
                    return f"job {job_id} running {now - since:.0f}s, past its {timeout:.0f}s timeout"
            if not self.loop_beat:
                return None
            limit = self.dequeue_timeout + LOOP_SLACK
            if now - self.loop_beat > limit:
                return f"rq loop silent for {now - self.loop_beat:.0f}s (limit {limit:.0f}s)"
            return None

    return InFlightWorker


# The collector's young generation: objects allocated (net) before a collection. CPython's 700
# suits a program with few live objects; a worker with hundreds of tasks in hand keeps each
# task's frames, messages and results alive for the length of a model call, so every young
# collection walks (and promotes) them again: at a thousand tasks in hand ~25% of the worker's
# CPU went to the collector (gc.callbacks, bench/concurrency.py). Larger saves more CPU and
# holds more garbage: at 10000 the fan-out's peak RSS grew ~10 MB.
GC_YOUNG = 4_000


SWITCH_PER_SLOT = 10e-6  # seconds of interpreter switch interval per in-flight slot
SWITCH_MAX = 0.05


def tune_switch_interval(slots: int) -> float:
    """Lengthen the interpreter's switch interval with the slots of this process (10 us per
    slot, between CPython's 5 ms and 50 ms); returns it.

    Every thread waiting for the GIL wakes once per switch interval to ask the holder to let
    go. When a few thousand tasks wake together (a second 5000-task fan-out on a worker whose
    threads are all warm: their model calls end within a few ms of each other), those
    wake-ups alone -- thousands of runnable threads, a load average in the thousands -- left
    the holder little time to run: 112 ms of CPU per task and a 302 s drain instead of ~20 s,
    every lease lost and the run's tasks requeued (bench/concurrency.py --count 5000,
    repeated rounds). At 50 ms the same round took 19 s at 3.8 ms per task. A thread that
    blocks (Redis, the model, a sleep) still lets go at once; only a thread computing pure
    Python for longer than the interval is asked to yield later, which is why it grows with
    the slots rather than being long for every worker."""
    interval = min(SWITCH_MAX, max(sys.getswitchinterval(), slots * SWITCH_PER_SLOT))
    sys.setswitchinterval(interval)
    return interval


MALLOC_ARENAS = 2  # glibc malloc arenas for a process running many threads (M_ARENA_MAX)
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc's malloc.h)


def cap_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process at ``arenas``; True if it did.

    glibc gives threads arenas of their own, up to 8 per core, and each keeps the memory
    its threads freed: a thousand task threads allocating replies and messages spread over
    16 arenas on a 2-core machine took a 1000-task fan-out's peak RSS to 97-127 MB from run
    to run, 96-97 MB with two arenas, at the same CPU (bench/concurrency.py --only network,
    3 alternating runs each). Python's own small objects do not use malloc's arenas; this
    is what larger allocations (Redis replies, JSON) cost. ``MALLOC_ARENA_MAX`` in the
    environment (read by glibc at start-up) is the operator's choice and is left alone;
    elsewhere than glibc (musl, macOS) nothing is done. Called before the worker starts its
    threads: arenas already made stay."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, max(1, int(arenas))))


def tune_gc() -> None:
    """Once the worker is about to take jobs: what start-up imported (litellm, rq, the app)
    moves to the permanent generation (``gc.freeze``: full collections no longer walk it),
    and young collections run every ``GC_YOUNG`` allocations, not 700. Cycles among a task's
    objects are still collected, later. Done once per process."""
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG), middle, old)
    remember_protocol_members()


_gc_tuned = False


def remember_protocol_members() -> None:
    """On Python 3.11, ``isinstance(x, P)`` for a runtime-checkable Protocol ``P`` walks P's
    MRO and dicts for its member names on every call, twice (3.12 computes them once per
    class). rq checks its ``Serializer`` protocol each time it makes a job, registry or
    result object: five times per task, ~5% of an in-flight worker's CPU at a thousand tasks
    in hand (yappi, bench/concurrency.py). The member names of a class do not change once
    it is made, so the worker computes them once per class (a frozenset: typing only reads
    them)."""
    compute = getattr(typing, "_get_protocol_attrs", None)
    if sys.version_info >= (3, 12) or compute is None or getattr(compute, "remembered", False):
        return
    known: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()

    def protocol_attrs(cls: type) -> frozenset[str]:
        try:
            return known[cls]
        except KeyError:
            attrs = known[cls] = frozenset(compute(cls))
            return attrs

    protocol_attrs.remembered = True  # type: ignore[attr-defined]
    typing._get_protocol_attrs = protocol_attrs  # type: ignore[attr-defined]


def _held_key(job: Any) -> str | None:
    """``R:held:<task>`` of a network task job (the Ruby gem's job function and its plain-data
    arguments), else None."""
    from robot_lab.network.enqueue import JOB_FUNC  # lazy: start-up time

    args = job.args
    if job.func_name != JOB_FUNC or len(args) != 4 or not all(isinstance(a, str) for a in args):
        return None

    prefix, run_id, task, _ = args
    return Keys(prefix=prefix, cluster=get_settings().cluster_keys).run_held(run_id, task)

