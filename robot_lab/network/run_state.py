"""A network run's state in Redis: the RunStore API over the Lua transitions.

The run lives in Redis, not in any process: the coordinator that submitted it, every worker
that finishes one of its tasks, and any watcher can advance it. Each transition is one Lua
script, so two parents finishing at the same moment never enqueue a child twice, a task whose
result is recorded is never claimed again, and every state change and its event are written
together (events carry a per-run monotonic ``seq``).

Keys (``R`` = ``Keys.run(run_id)``, all sharing the run's hash tag in cluster mode)::

    R               hash   network, status, message, context, spec, app, order, seq, open, active, ...
    R:graph         hash   task -> {deps, optional, activators, robot} (JSON)
    R:state         hash   task -> pending|ready|queued|running|waiting|done|failed|skipped|cancelled
    R:jobs          hash   task -> rq job id of the current attempt
    R:attempts      hash   task -> number of attempts enqueued; resumed:<task> -> how many were resumes
    R:queued_at     hash   task -> time the current attempt was enqueued
    R:results       hash   task -> RobotResult JSON
    R:activated     set    optional tasks a router activated
    R:inputs        hash   task -> the message its robot received
    R:ready         zset   ready tasks (held back by max_concurrent), scored by their place in the order
    R:counts        hash   l:<task> -> its parents not ended yet, r:<task> -> ended and not skipped
    R:lease:<task>  string worker name, PX lease refreshed by the running job's heartbeat
    R:stranded:<task> string job id a sweep saw off its rq queue while queued (60 s TTL)
    R:held:<task>   string job id a live worker took off its queue and has not started (PX)
    R:swept         string a process swept the run lately (PX: the sweep interval, longer for a wide run)
    R:budget_holds:<job>  set  budgets the attempt reserved in (released when its lease is gone)
    R:events        stream one field ``event`` = RunEvent JSON
    <prefix>:runs:active  set of run ids not finished (swept for lost workers)

Task states: ``pending`` (waiting for parents / activation) -> ``ready`` (runnable, held back
by ``max_concurrent_robots``) -> ``queued`` (an rq job exists or is about to) -> ``running``
(claimed by a worker holding the lease) -> ``done`` | ``failed``; or ``skipped`` (never
activated, or every parent skipped) and ``cancelled``. A running task whose robot asks a
person parks as ``waiting`` (no lease, no job) until answered, then goes back to ``ready``
(:mod:`.human_input`).

Run statuses (``R.status``): ``running`` -> ``completed`` (every task ended and none failed)
| ``completed_with_errors`` (every task ended and at least one failed: the run went on past
the failure, as a network does, but it is not a success) | ``cancelled``. The finishing
transition is ``finish_run`` in :mod:`.transitions`; it also writes ``tasks_done``,
``tasks_failed`` and ``tasks_skipped`` on the run record.

The scripts themselves are in :mod:`.transitions`; turning runnable tasks into rq jobs is
:mod:`.enqueue`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from redis.exceptions import NoScriptError

from robot_lab import coalesce, folded_writes
from robot_lab.connection import durable, is_cluster_client, waits_for_replicas
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.network import transitions
from robot_lab.network.dag import Graph, NetworkSpec
from robot_lab.network.enqueue import queue_name
from robot_lab.network.retention import expire_finished_run
from robot_lab.network.serializer import JobSerializer
from robot_lab.network.submitting import SUBMITTING
from robot_lab.rq_connection import rq_connection
from robot_lab.schemas import RobotResult, RobotSpec, RunEvent
from robot_lab.tracing import outgoing_traceparent

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

__all__ = ["DEFAULT_LEASE_MS", "RUN_CANCELLED", "RUN_COMPLETED", "RUN_COMPLETED_WITH_ERRORS", "RUN_FINISHED", "RUN_TTL",
           "TERMINAL", "RunStore", "SweepView", "TaskStart"]

TERMINAL = frozenset({"done", "failed", "skipped", "cancelled"})
RUN_COMPLETED = "completed"
RUN_COMPLETED_WITH_ERRORS = "completed_with_errors"  # finished, but a task failed
RUN_CANCELLED = "cancelled"
RUN_FINISHED = (RUN_COMPLETED, RUN_COMPLETED_WITH_ERRORS, RUN_CANCELLED)
DEFAULT_LEASE_MS = 5000
DEFAULT_MAX_ATTEMPTS = 5
RUN_TTL = 7 * 86_400

log = get_logger("robot_lab.network")


@dataclass
class TaskStart:
    """What :meth:`RunStore.start_task` read: the claim's status and, when it is ``ok``, the
    run record's fields, the parents' results (or activators' inputs) in graph order, and
    the replies of the extra reads."""

    status: str
    meta: dict[str, str] = field(default_factory=dict)
    sources: list[str | None] = field(default_factory=list)
    also: list[Any] = field(default_factory=list)
    before_written: bool = False  # the ``before`` writes went out with the claim


@dataclass
class SweepView:
    """One read of a run's task states, job ids and enqueue times, shared by a sweep's checks."""

    states: dict[str, str]
    jobs: dict[str, str]
    queued_at: dict[str, float]
    job_statuses: dict[str, str | None] | None = None  # filled on first use


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _triples(raw: list[Any]) -> list[tuple[str, str, str]]:
    items = [_decode(v) for v in raw]
    return [(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]


class RunStore:
    """One run's state in Redis: submit, claim, complete, reclaim, cancel, read.

    Methods that may make tasks runnable return ``(task, job_id, robot)`` triples; the
    caller must enqueue them (:func:`~robot_lab.network.enqueue.enqueue_jobs`) -- a crash in between is repaired by
    :meth:`repair_queued`, and a duplicate job is harmless because claims are checked here.
    """

    def __init__(self, connection: RedisClient, keys: Keys, run_id: str) -> None:
        self.r = connection
        self.keys = keys
        self.run_id = run_id
        self.key = keys.run(run_id)

    # --- scripts ---------------------------------------------------------------------
    def _eval(self, script: str, *argv: Any, leases: tuple[str, ...] = (), critical: bool = False) -> Any:
        """Run a transition with every key it touches declared (the run's keys, then the
        leases of ``leases``); ``critical`` ones wait for replicas (``redis_wait_replicas``)."""
        keys = self._script_keys(leases)
        if critical:
            return durable(self.r, lambda target: transitions.run_script(target, script, keys, self.run_id, *argv))
        return transitions.run_script(self.r, script, keys, self.run_id, *argv)

    def _eval_then(self, after: Any, script: str, *argv: Any, leases: tuple[str, ...] = (),
                   critical: bool = False, before: Any = None) -> Any:
        """:meth:`_eval`, with ``after``'s writes queued behind the script in its pipeline
        (one round trip) where that keeps the script's guarantees: one server for every key
        (not Cluster) and, for a ``critical`` script, no replicas to wait for. ``before`` (a
        step journal: ``queue_unwritten``, ``sent``, ``flush``) queues its writes ahead of the
        script there; elsewhere it flushes them first."""
        if (after is None and before is None) or is_cluster_client(self.r) or (
                critical and waits_for_replicas(self.r)):
            if before is not None:
                before.flush()
            return self._eval(script, *argv, leases=leases, critical=critical)
        keys = self._script_keys(leases)
        pipe = coalesce.pipeline(self.r)
        skip = before.queue_unwritten(pipe) if before is not None else 0
        pipe.evalsha(transitions.sha_of(script), len(keys), *keys, self.run_id, *argv)
        if after is not None:
            after.queue(pipe)
        replies = coalesce.execute(pipe, raise_on_error=False)  # with other tasks' results
        if before is not None:
            ahead, replies = replies[:skip], replies[skip:]
            failed = next((r for r in ahead if isinstance(r, Exception)), None)
            if failed is not None:  # the script ran all the same: its outcome no longer needs them
                log.warning("run.journal_write_failed", error=f"{type(failed).__name__}: {failed}")
            before.sent()
        first = replies[0]
        if after is not None:
            failed = next((r for r in replies[1:] if isinstance(r, Exception)), None)
            if failed is None:
                after.written = True
            elif not folded_writes.missing(failed, self.r):  # (missing: folded writes, no script yet)
                # not the script's: the caller writes them again on its own
                log.warning("run.piped_writes_failed", error=f"{type(failed).__name__}: {failed}")
        if isinstance(first, NoScriptError):  # first use on this server: EVAL caches it
            return self._eval(script, *argv, leases=leases, critical=critical)
        if isinstance(first, Exception):
            raise first
        return first

    def _script_keys(self, leases: tuple[str, ...] = ()) -> list[str]:
        """A transition's KEYS: the run's keys, then the leases of ``leases``."""
        keys = [self.key + suffix for suffix in transitions.RUN_KEY_SUFFIXES]
        keys.extend(self.lease_key(task) for task in leases)
        return keys

    def lease_key(self, task: str) -> str:
        return self.keys.run_lease(self.run_id, task)

    # --- submit ----------------------------------------------------------------------
    def create(
        self,
        graph: Graph,
        *,
        message: Any,
        context: dict[str, Any],
        app: str | None,
        max_concurrent: int | None,
        robots: dict[str, str] | None = None,
        stream: bool = True,
        build: str | None = None,
        pinned: bool = False,
    ) -> list[tuple[str, str, str]]:
        """Write the run and start it; ``build``: the build it is submitted on, ``pinned``:
        served only by workers of that build (network/builds.py)."""
        spec_json = msgspec.json.encode(graph.spec).decode()
        # The indexes live in other cluster slots than the run's own keys, so they are written
        # first and outside the transaction: a run id in the index whose record never got
        # written is ignored by sweepers and listings, while a run missing from the active set
        # would never be swept.
        index = self.r.pipeline(transaction=False)
        index.sadd(self.keys.runs_active(), self.run_id)
        index.zadd(self.keys.runs_index(), {self.run_id: time.time()})
        index.execute()
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(
            self.key,
            mapping={
                "network": graph.spec.name,
                "status": "running",
                "message": json.dumps(message),
                "context": json.dumps(context),
                "spec": spec_json,
                "app": app or "",
                "order": json.dumps(graph.order),
                "max_concurrent": str(max_concurrent or 0),
                "created_at": str(time.time()),
                "prefix": self.keys.prefix,
                "robots": json.dumps(robots or {}),
                "stream": "1" if stream else "0",
                "seq": "0",
                "open": str(len(graph.order)),  # tasks not ended (the transitions keep it)
                "active": "0",  # tasks queued or running (max_concurrent)
                "traceparent": _outgoing_traceparent(),
                "build": build or "",
                "pinned": "1" if pinned and build else "0",
                SUBMITTING: str(time.time()),  # removed once its first jobs are enqueued (submitting.py)
            },
        )
        pipe.hset(self.key + ":graph", mapping={k: json.dumps(v) for k, v in graph.lua_graph().items()})
        pipe.hset(self.key + ":state", mapping={name: "pending" for name in graph.order})
        pipe.hset(self.key + ":counts", mapping=graph.counts())
        pipe.execute()
        data = json.dumps({"network": graph.spec.name, "tasks": graph.order})
        return _triples(self._eval(transitions.START, data))

    # --- worker side -----------------------------------------------------------------
    def claim(self, task: str, job_id: str, worker: str, lease_ms: int = DEFAULT_LEASE_MS) -> str:
        return _decode(self._eval(transitions.CLAIM, task, job_id, worker, lease_ms, leases=(task,)))

    def start_task(self, task: str, job_id: str, worker: str, lease_ms: int, fields: list[str],
                   also: Callable[[Any], None] | None = None,
                   before: Callable[[Any], None] | None = None) -> TaskStart:
        """Claim ``task`` (as :meth:`claim`) and read what its job needs before the robot runs
        -- the run record's ``fields`` and the parents' results (a routed task: its activators'
        inputs) -- in one round trip; ``also`` adds more reads to the same pipeline (their
        replies land in ``TaskStart.also``). ``before`` queues writes ahead of the claim in
        that pipeline (not on Redis Cluster, whose pipelines refuse scripts: there the caller
        writes them itself; ``TaskStart.before_written`` says which)."""
        argv = (task, job_id, worker, lease_ms, json.dumps(fields))
        before_ran = False
        if is_cluster_client(self.r):  # redis-py's cluster pipeline refuses scripts: two round trips
            first = self._eval(transitions.START_TASK, *argv, leases=(task,))
            replies = [first]
            if also is not None:
                pipe = self.r.pipeline(transaction=False)
                also(pipe)
                replies += pipe.execute()
        else:
            keys = self._script_keys((task,))
            pipe = coalesce.pipeline(self.r)
            if before is not None:
                before(pipe)
            skip = len(pipe.command_stack)
            pipe.evalsha(transitions.sha_of(transitions.START_TASK), len(keys), *keys, self.run_id, *argv)
            if also is not None:
                also(pipe)
            replies = coalesce.execute(pipe, raise_on_error=False)  # with other tasks' claims
            for reply in replies:
                if isinstance(reply, Exception) and not isinstance(reply, NoScriptError):
                    raise reply
            # a ``before`` folded into a script the server lacks (robot_lab/folded_writes.py) did
            # not run: the caller writes it itself
            before_ran = not any([folded_writes.missing(reply, self.r) for reply in replies[:skip]])
            replies = replies[skip:]
            first = replies[0]
            if isinstance(first, NoScriptError):  # first use on this server: EVAL caches it
                first = self._eval(transitions.START_TASK, *argv, leases=(task,))
        written = before is not None and not is_cluster_client(self.r) and before_ran
        status = _decode(first[0])
        if status != "ok":
            return TaskStart(status, before_written=written)
        meta = {name: _decode(v) for name, v in zip(fields, first[1]) if v is not None}
        return TaskStart(status, meta, [None if v is None else _decode(v) for v in first[2]], replies[1:],
                         before_written=written)

    def complete(
        self,
        task: str,
        job_id: str,
        result: RobotResult,
        *,
        activate: list[str] | None = None,
        data: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        input: str | None = None,
        events: list[tuple[str, dict[str, Any] | None]] = (),  # type: ignore[assignment]
        after: Any = None,
        journal: Any = None,
    ) -> tuple[str, list[str], list[tuple[str, str, str]]]:
        """Record the result (and the ``input`` its robot received) and advance. ``events`` are
        the task's events still unsent (its last ``text.delta``, ``memory.changed``): emitted
        first, in the same script. ``after`` (an object with ``queue(pipe)`` and ``written``)
        queues more writes behind the script in the same pipeline -- not on Redis Cluster
        nor while results wait for replicas (``redis_wait_replicas``), where ``written``
        stays False and the caller writes them itself. ``journal`` (the task's step journal)
        writes its pending steps ahead of the script, in the same round trip where ``after``
        could go (else in one of their own first). Returns (status, ignored activations,
        jobs to enqueue)."""
        outcome = "failed" if result.failed else "done"
        owed = [part for event, data in events for part in (event, json.dumps(data) if data else "")]
        raw = self._eval_then(
            after,
            transitions.COMPLETE,
            task,
            job_id,
            msgspec.json.encode(result).decode(),
            outcome,
            json.dumps(activate or []),
            json.dumps(data or {}),
            json.dumps(usage) if usage else "",
            "0" if input is None else "1",
            input or "",
            *owed,
            leases=(task,),
            critical=True,  # a recorded result must survive a failover: it is paid for
            before=journal if journal is not None and journal.unwritten else None,
        )
        status = _decode(raw[0])
        if status != "ok":
            return status, [], []
        return status, json.loads(_decode(raw[1])), _triples(raw[2:])

    def release(self, task: str, job_id: str, error: str) -> bool:
        return bool(self._eval(transitions.RELEASE, task, job_id, json.dumps({"error": error}), leases=(task,)))

    def emit(self, event: str, *, task: str | None = None, robot: str | None = None,
             data: dict[str, Any] | None = None) -> None:
        self._eval(transitions.EMIT, event, task or "", robot or "", json.dumps(data) if data else "")

    # --- recovery / control ----------------------------------------------------------
    def reclaim(self, max_attempts: int | None = None, tasks: list[str] | None = None) -> list[tuple[str, str, str]]:
        """Running tasks whose lease expired go back to ready (a new attempt); after
        ``max_attempts`` lost workers (``ROBOT_LAB_TASK_MAX_ATTEMPTS``, default 5) the task is
        recorded as failed instead, and the run goes on. ``tasks``: the ones to look at (a
        sweep passes those :meth:`lost_attempts` found; the script checks each again), else
        every running task."""
        if max_attempts is None:
            max_attempts = int(os.environ.get("ROBOT_LAB_TASK_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS))
        if tasks is None:
            tasks = [task for task, state in self.states().items() if state == "running"]
        if not tasks:
            return []
        return _triples(self._eval(transitions.RECLAIM, max_attempts, *tasks, leases=tuple(tasks)))

    def sweep_view(self) -> SweepView:
        """What a sweep reads of the run, in one round trip: task states, current job ids,
        enqueue times. A sweep passes it to :meth:`lost_attempts`, :meth:`repair_queued` and
        :meth:`failed_jobs` (each reads its own when given none)."""
        pipe = self.r.pipeline(transaction=False)
        for suffix in ("state", "jobs", "queued_at"):
            pipe.hgetall(f"{self.key}:{suffix}")  # one slot (the run's hash tag)
        states, jobs, queued_at = ({_decode(k): _decode(v) for k, v in raw.items()} for raw in pipe.execute())
        return SweepView(states, jobs, {k: float(v) for k, v in queued_at.items()})

    def _queued_job_statuses(self, view: SweepView) -> dict[str, str | None]:
        """rq status of each queued task's job (None: no such job), one pipeline, kept on
        the view: both :meth:`repair_queued` and :meth:`failed_jobs` ask."""
        if view.job_statuses is None:
            from rq.job import Job  # lazy: start-up time

            queued = [(task, view.jobs[task]) for task, state in view.states.items()
                      if state == "queued" and view.jobs.get(task)]
            pipe = rq_connection(self.r).pipeline(transaction=False)  # rq's keys: its slot owner on Cluster
            for _, job_id in queued:  # a fan-out's queue holds hundreds of them while it drains
                pipe.hget(Job.key_for(job_id), "status")
            replies = pipe.execute() if queued else []
            view.job_statuses = {task: None if raw is None else _decode(raw)
                                 for (task, _), raw in zip(queued, replies)}
        return view.job_statuses

    def lost_attempts(self, view: SweepView | None = None) -> list[tuple[str, str]]:
        """``(task, job_id)`` of running tasks whose lease is gone: their worker died (or
        stalled past the lease), so :meth:`reclaim` is about to re-run them."""
        view = view or self.sweep_view()
        running = [task for task, state in view.states.items() if state == "running"]
        if not running:
            return []
        pipe = self.r.pipeline(transaction=False)
        for task in running:
            pipe.exists(self.lease_key(task))
        return [(task, view.jobs[task]) for task, alive in zip(running, pipe.execute())
                if not alive and task in view.jobs]

    def budget_holds_key(self, job_id: str) -> str:
        """Set of the budgets an attempt holds reservations in (see BudgetHolder)."""
        return f"{self.key}:budget_holds:{job_id}"

    def advance(self) -> list[tuple[str, str, str]]:
        return _triples(self._eval(transitions.ADVANCE))

    def cancel(self, reason: str = "cancelled") -> str:
        return _decode(self._eval(transitions.CANCEL, reason))

    def rerun(self, task: str) -> tuple[str, list[str], list[tuple[str, str, str]]]:
        """Run failed ``task`` again, and everything downstream of it after it (see RERUN in
        :mod:`.transitions`). Returns (status, the tasks reset, jobs to enqueue); status
        ``ok``, or why not: ``unknown``, ``cancelled``, ``unknown-task``, ``not-failed``,
        ``busy <task>``."""
        raw = [_decode(v) for v in self._eval(transitions.RERUN, task)]
        if raw[0] != "ok":
            return " ".join(raw), [], []
        count = int(raw[1])
        return "ok", raw[2:2 + count], _triples(raw[2 + count:])

    def repair_queued(self, grace: float = 2.0, view: SweepView | None = None) -> list[tuple[str, str, str]]:
        """Queued tasks whose rq job vanished (the enqueuer died between script and enqueue)."""
        view = view or self.sweep_view()
        now = time.time()
        due = {task: status for task, status in self._queued_job_statuses(view).items()
               if now - view.queued_at.get(task, 0) >= grace}
        lost = [task for task, status in due.items() if status is None]
        waiting = [task for task, status in due.items() if status == "queued"]
        if not lost and not waiting:
            return []
        graph = {task: json.loads(raw)["robot"] for task, raw in self._hash("graph").items()}
        lost += self._stranded(waiting, view, graph, grace)
        return [(task, view.jobs[task], graph[task]) for task in lost]

    def _stranded(self, tasks: list[str], view: SweepView, graph: dict[str, str], grace: float) -> list[str]:
        """Tasks whose rq job says ``queued`` but sits in no queue: a worker took it off the
        queue (rq's BLMOVE into its intermediate list) and a Redis crash or failover lost
        what came next. rq itself cleans its intermediate list only every 10 minutes, and
        then fails the job; re-enqueueing it (the same job id) is harmless, as claims are
        checked. A job is also off its queue for the moment between a worker's BLMOVE and
        its start, so it counts as stranded only when a sweep at least ``grace`` seconds
        earlier saw it off the queue too (``R:stranded:<task>``, 60 s TTL), and a job a live
        worker holds (``R:held:<task>``: the in-flight worker takes many jobs at once, and one
        may wait seconds for a thread) is never stranded. One pipelined LRANGE per queue the
        tasks' robots use (an LPOS per task scanned the queue once per task: a thousand queued
        tasks made each sweep a million comparisons in Redis, bench/dag.py), then one EXISTS per
        task off its queue, and SET NX + PTTL for those no live worker holds."""
        if not tasks:
            return []
        from rq import Queue  # lazy: start-up time

        rq = rq_connection(self.r)
        keys = sorted({Queue(queue_name(graph[task]), connection=rq).key for task in tasks})
        pipe = rq.pipeline(transaction=False)
        for key in keys:
            pipe.lrange(key, 0, -1)
        queued = {_decode(job_id) for ids in pipe.execute() for job_id in ids}
        off = [task for task in tasks if view.jobs[task] not in queued]
        if not off:
            return []
        seen_ms = 60_000
        pipe = self.r.pipeline(transaction=False)
        for task in off:
            pipe.exists(self.keys.run_held(self.run_id, task))
        held = pipe.execute()
        forget = [task for task, is_held in zip(off, held) if is_held]  # a live worker has it
        loose = [task for task, is_held in zip(off, held) if not is_held]
        stranded = []
        if loose:  # (an in-flight worker holds most of a wide fan-out: no marker for those)
            pipe = self.r.pipeline(transaction=False)
            for task in loose:
                pipe.set(f"{self.key}:stranded:{task}", view.jobs[task], nx=True, px=seen_ms)
                pipe.pttl(f"{self.key}:stranded:{task}")
            replies = pipe.execute()
            stranded = [task for i, task in enumerate(loose)
                        if not replies[2 * i] and seen_ms - int(replies[2 * i + 1]) >= grace * 1000]
        if stranded or forget:  # the run's keys share its hash tag: one slot, one DEL
            self.r.delete(*(f"{self.key}:stranded:{task}" for task in stranded + forget))
        return stranded

    def failed_jobs(self, view: SweepView | None = None) -> list[tuple[str, str, str]]:
        """Queued tasks whose rq job failed *outside* our job function -- e.g. a worker that
        could not deserialize it (a worker started with a foreign ``-S`` serializer). Returns
        (task, job_id, error text)."""
        from rq.job import Job, JobStatus  # lazy: start-up time

        out: list[tuple[str, str, str]] = []
        view = view or self.sweep_view()
        # the statuses come from one pipelined HGET per job; only failed jobs are loaded in full
        for task, status in self._queued_job_statuses(view).items():
            if status != JobStatus.FAILED.value:
                continue
            job_id = view.jobs[task]
            try:
                job = Job.fetch(job_id, connection=rq_connection(self.r), serializer=JobSerializer)
            except Exception:
                continue
            text = ""
            try:
                latest = job.latest_result()
                text = (latest.exc_string or "") if latest is not None else ""
            except Exception:
                pass
            last = [line for line in text.strip().splitlines() if line.strip()]
            out.append((task, job_id, last[-1] if last else "job failed in rq"))
        return out

    # --- reading ---------------------------------------------------------------------
    def _hash(self, suffix: str) -> dict[str, str]:
        return {_decode(k): _decode(v) for k, v in self.r.hgetall(f"{self.key}:{suffix}").items()}

    def exists(self) -> bool:
        return bool(self.r.exists(self.key))

    def meta(self) -> dict[str, str]:
        raw = self.r.hgetall(self.key)
        if not raw:
            raise ConfigurationError(f"run {self.run_id!r} not found (prefix {self.keys.prefix!r})")
        return {_decode(k): _decode(v) for k, v in raw.items()}

    def spec(self) -> NetworkSpec:
        return msgspec.json.decode(self.meta()["spec"], type=NetworkSpec)

    def robot_specs(self, meta: dict[str, str] | None = None) -> dict[str, Any]:
        """Robot name -> RobotSpec, as resolved when the run was submitted."""
        raw = meta["robots"] if meta is not None and "robots" in meta else self.r.hget(self.key, "robots")
        data = json.loads(raw) if raw else {}
        return {name: msgspec.json.decode(text, type=RobotSpec) for name, text in data.items()}

    def status(self) -> str:
        value = self.r.hget(self.key, "status")
        return _decode(value) if value is not None else "unknown"

    def states(self) -> dict[str, str]:
        return self._hash("state")

    def attempts(self) -> dict[str, int]:
        """Attempts enqueued per task (each resume after an answer is one too)."""
        return {k: int(v) for k, v in self._hash("attempts").items() if not k.startswith("resumed:")}

    def resumes(self) -> dict[str, int]:
        """Attempts per task that were resumes after an answer, not lost workers."""
        return {k[len("resumed:"):]: int(v) for k, v in self._hash("attempts").items() if k.startswith("resumed:")}

    def job_id(self, task: str) -> str | None:
        value = self.r.hget(self.key + ":jobs", task)
        return _decode(value) if value is not None else None

    def results(self) -> dict[str, RobotResult]:
        return {
            k: msgspec.json.decode(v, type=RobotResult)
            for k, v in self._hash("results").items()
        }

    def result(self, task: str) -> RobotResult | None:
        raw = self.r.hget(self.key + ":results", task)
        return msgspec.json.decode(raw, type=RobotResult) if raw is not None else None

    def activated(self) -> set[str]:
        return {_decode(v) for v in self.r.smembers(self.key + ":activated")}

    def events(self, after: str = "0-0", count: int | None = None, block_ms: int | None = None
               ) -> list[tuple[str, RunEvent]]:
        stream = self.keys.run_events(self.run_id)
        if block_ms is not None:
            raw = self.r.xread({stream: after}, count=count, block=block_ms)
            entries = raw[0][1] if raw else []
        else:
            entries = self.r.xrange(stream, min=f"({after}" if after != "0-0" else "-", count=count)
        return [
            (_decode(entry_id), msgspec.json.decode(fields[b"event"], type=RunEvent))
            for entry_id, fields in entries
        ]

    def finish_housekeeping(self) -> None:
        """Once a run is over: drop it from the active set and let its keys expire."""
        pipe = self.r.pipeline(transaction=False)
        pipe.srem(self.keys.runs_active(), self.run_id)
        for suffix in transitions.RUN_KEY_SUFFIXES:
            pipe.expire(self.key + suffix, RUN_TTL)
        expire_finished_run(pipe, self.keys, self.run_id, RUN_TTL)  # its memory, the runs index
        pipe.execute()


def _outgoing_traceparent() -> str:
    return outgoing_traceparent()
