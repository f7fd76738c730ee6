"""The coordinator: submits network runs to Redis, follows them, and sweeps for lost work.

It holds nothing a run needs: the run's spec, per-task state, activations and results live
in Redis (:mod:`.run_state`), and workers advance the DAG themselves when a task finishes.
A coordinator (or ``robot-lab watch``, or any worker) only adds two things while it is
around: it waits for the result, and it *sweeps* -- tasks whose worker stopped heart-beating
go back to the queue, and queued tasks whose rq job vanished are enqueued again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from robot_lab.connection import get_redis
from robot_lab.errors import AwaitTimeout, ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.network.builds import build_for_app, default_pinned, requeue_handed_back
from robot_lab.network.dag import Graph, compile_network
from robot_lab.network.enqueue import enqueue_jobs
from robot_lab.network.graphs import graph_for
from robot_lab.network.lease import task_lease_ms
from robot_lab.network.run_state import RunStore
from robot_lab.network import human_input as waiting
from robot_lab.network.submitting import SUBMITTING, discard, sweep_leftover
from robot_lab.observability import instrument as observe
from robot_lab.outage import OutageTracker, is_outage, out_of_memory
from robot_lab.runtime.rails.budget.redis_ledger import release_holder
from robot_lab.runtime.registry import check_importable, configured_robots, publish_specs, published_spec
from robot_lab.runtime.tools import import_object
from robot_lab.schemas import RobotResult, RobotSpec, RunEvent, TextMessage, new_id

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.coordinator")

SWEEP_EVERY = 0.5  # seconds between sweeps of a followed run
# A sweep reads every queued and running task of the run (states, leases, rq job statuses:
# ~40 us of client and Redis CPU per task), so a paced sweep of a wide run waits this long
# per such task (at least SWEEP_EVERY), which keeps sweeping under ~2% of a core: a
# 5000-task fan-out swept twice a second spent a core's fifth on it, in the coordinator and
# in every worker, and at 1 ms per task sweeps were still ~5% of the CPU of a 1000-task
# fan-out on 4 workers (bench/dag.py (e)), while a lost worker is found only once its lease
# (5 s) expired anyway.
SWEEP_MS_PER_TASK = 2.0
# RunHandle.wait() with no on_event reads the run's events at most this often while they keep
# coming (seconds): the end is seen that much late at most.
WAIT_COALESCE = 0.02


def is_embedded(connection: RedisClient) -> bool:
    """True for the in-process fakeredis (embedded mode)."""
    return type(connection).__module__.startswith("fakeredis")


@dataclass
class NetworkResult:
    """A finished run (the Ruby gem's ``SimpleFlow::Result``): ``value`` is the final task's
    RobotResult, ``context`` maps every task that ran to its RobotResult."""

    run_id: str
    network: str
    status: str
    value: RobotResult | None
    context: dict[str, RobotResult]
    states: dict[str, str]
    activated: set[str] = field(default_factory=set)
    final_task: str | None = None

    @property
    def reply(self) -> str | None:
        return self.value.reply if self.value is not None else None

    @property
    def ok(self) -> bool:
        """True only for a run that finished with no failed task."""
        return self.status == "completed"

    @property
    def failed_tasks(self) -> list[str]:
        """The tasks whose robot failed (the run went on past them)."""
        return [name for name, state in self.states.items() if state == "failed"]

    def __getitem__(self, task: str) -> RobotResult:
        return self.context[task]


class RunHandle:
    """A submitted run: events, waiting, cancelling. Cheap to create for any run id."""

    def __init__(self, coordinator: Coordinator, run_id: str) -> None:
        self.coordinator = coordinator
        self.run_id = run_id
        self.store = RunStore(coordinator.connection, coordinator.keys, run_id)

    @property
    def status(self) -> str:
        return self.store.status()

    def states(self) -> dict[str, str]:
        return self.store.states()

    def events(self, after: str = "0-0") -> list[RunEvent]:
        return [event for _, event in self.store.events(after)]

    def pending(self) -> list[Any]:
        """The run's input requests waiting for an answer (docs/durable.md)."""
        return waiting.for_run(self.run_id, self.coordinator.connection, self.coordinator.keys)

    def answer(self, text: str | None = None, *, approve: bool | None = None, request_id: str | None = None,
               by: str = "api") -> Any:
        """Answer the run's input request (the only one pending, or ``request_id``) once;
        the task resumes on any worker of its robot."""
        if request_id is None:
            found = self.pending()
            if len(found) != 1:
                raise ConfigurationError(f"run {self.run_id} has {len(found)} pending input requests; "
                                         "pass request_id=" + (f" (one of {', '.join(r.id for r in found)})" if found else ""))
            request_id = found[0].id
        return waiting.answer(request_id, text, approve=approve, by=by, connection=self.coordinator.connection,
                              keys=self.coordinator.keys)

    def follow(self, *, timeout: float | None = None, sweep: bool = True,
               block_ms: int = 500) -> Iterator[RunEvent]:
        """Yield events as they come (replaying from the start) until the last ``stream.ended``.

        A Redis outage (restart, failover) is waited out with backoff and one ``redis.lost``
        / ``redis.back`` log line pair; the events are read on from where they stopped."""
        rounds = _Rounds(self, timeout, sweep)
        last = "0-0"

        def read() -> tuple[list[tuple[str, RunEvent]], bool]:
            entries = self.store.events(last, block_ms=None if last == "0-0" else block_ms)
            return entries, not entries and self.store.status() not in ("running", "unknown")

        while True:
            entries, over = rounds.next(read)
            for index, (entry_id, event) in enumerate(entries):
                last = entry_id
                yield event
                # the end, unless a re-run task made the finished run run again: its events follow
                if event.event == "stream.ended" and index == len(entries) - 1 and self.store.status() != "running":
                    return
            if over:
                return
            rounds.check_deadline()

    def wait(self, timeout: float | None = None, *, on_event: Callable[[RunEvent], Any] | None = None,
             ) -> NetworkResult:
        """Block until the run is over (sweeping for lost workers meanwhile)."""
        if on_event is None:
            self._await_end(timeout)
        else:
            for event in self.follow(timeout=timeout):
                on_event(event)
        return OutageTracker("coordinator").call(self.result)

    def _await_end(self, timeout: float | None, block_ms: int = 500) -> None:
        """:meth:`follow`'s end, without its events: a waiter that wants none reads the stream
        in batches (at most one read per ``WAIT_COALESCE`` seconds while events keep coming)
        and decodes one event per read. Following every event of a 1000-task fan-out cost
        the waiting process ~1.7 reads and six decoded events per task, on the cores the
        workers need (bench/dag.py (e)); the end is seen at most ``WAIT_COALESCE`` late."""
        rounds = _Rounds(self, timeout, True)
        stream = self.store.keys.run_events(self.run_id)
        last: str | None = None  # None: where the stream is now (a finished run ends there at once)

        def read() -> tuple[list[Any], bool]:
            nonlocal last
            if last is None:
                entries = self.store.r.xrevrange(stream, count=1)
            else:
                raw = self.store.r.xread({stream: last}, block=block_ms)
                entries = raw[0][1] if raw else []
            # the end as follow() sees it: the last event read is stream.ended and the run is not
            # running (a re-run task makes a finished run run again), or none came and it is over
            over = (bool(entries) and _event_name(entries[-1]) == "stream.ended" and self.store.status() != "running"
                    or not entries and last is not None and self.store.status() not in ("running", "unknown"))
            last = _s(entries[-1][0]) if entries else last or "0-0"
            return entries, over

        while True:
            entries, over = rounds.next(read)
            if over:
                return
            rounds.check_deadline()
            if entries:
                time.sleep(WAIT_COALESCE)

    def result(self) -> NetworkResult:
        meta = self.store.meta()
        graph = graph_for(self.store)
        states = self.store.states()
        results = self.store.results()
        ran = [name for name in graph.order if name in results]
        final = next((n for n in reversed(graph.final_task_candidates()) if n in results), None)
        if final is None and ran:
            final = ran[-1]
        if meta.get("status") != "running":
            self.store.finish_housekeeping()
        return NetworkResult(
            run_id=self.run_id,
            network=meta.get("network", ""),
            status=meta.get("status", "unknown"),
            value=results.get(final) if final else None,
            context={name: results[name] for name in ran},
            states=states,
            activated=self.store.activated(),
            final_task=final,
        )

    def cancel(self, reason: str = "cancelled by user") -> str:
        return self.coordinator.cancel(self.run_id, reason)

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id}>"


class _Rounds:
    """The rounds of a follower (:meth:`RunHandle.follow`, :meth:`RunHandle.wait`): each reads
    the stream, then sweeps the run when its pace allows; a Redis outage is waited out (one
    ``redis.lost`` / ``redis.back`` pair) and the round comes back empty; past the deadline
    :meth:`check_deadline` raises."""

    def __init__(self, handle: RunHandle, timeout: float | None, sweep: bool) -> None:
        self.handle, self.timeout, self.sweep = handle, timeout, sweep
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last_sweep = 0.0
        self.outage = OutageTracker("coordinator")

    def next(self, read: Callable[[], tuple[list[Any], bool]]) -> tuple[list[Any], bool]:
        """``read()``'s (entries, over), or ([], False) after an outage."""
        try:
            entries, over = read()
            if self.sweep and time.monotonic() - self.last_sweep >= SWEEP_EVERY:
                self.last_sweep = time.monotonic()
                self.handle.coordinator.sweep_run(self.handle.run_id, paced=True)
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.outage.lost(exc)
            self.outage.pause()
            return [], False
        self.outage.back()
        return entries, over

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise AwaitTimeout(f"run {self.handle.run_id} did not finish within {self.timeout} s")


class Coordinator:
    """Submits runs and sweeps them. ``connection`` defaults to :func:`get_redis`."""

    def __init__(self, connection: RedisClient | None = None, keys: Keys | None = None) -> None:
        if connection is None:
            connection = get_redis()
        self.connection = connection
        self.keys = keys or default_keys()

    # --- submission -----------------------------------------------------------------------
    def resolve_robots(self, network: Any, graph: Graph) -> dict[str, RobotSpec]:
        """Each task's robot as a spec: the network's own robots, then its app's, then the
        configured app's, then the Redis registry. Unknown robots and unimportable tools or
        routers raise here, before anything is enqueued."""

        apps = [a for a in (getattr(network, "app", None),) if a is not None]
        try:
            configured = configured_robots()
        except ConfigurationError:
            configured = None
        if configured is not None and configured not in apps:
            apps.append(configured)
        specs: dict[str, RobotSpec] = {}
        for task_name in graph.order:
            task = graph.tasks[task_name]
            name = task.robot
            if name in specs:
                continue
            spec = network.robot_spec(name) if hasattr(network, "robot_spec") else None
            for app in apps:
                if spec is None and app.has_robot(name):
                    spec = app.robot_spec(name)
            if spec is None:
                spec = published_spec(name, connection=self.connection, keys=self.keys)
            if spec is None:
                raise ConfigurationError(
                    f"network {graph.spec.name!r}: task {task_name!r} uses unknown robot {name!r} "
                    "(not in the network, its app, ROBOT_LAB_APP, or the Redis robot registry)"
                )
            check_importable(spec)
            specs[name] = spec
        for task in graph.tasks.values():
            if task.router:
                try:
                    import_object(task.router)
                except ConfigurationError as exc:
                    raise ConfigurationError(f"network {graph.spec.name!r}: task {task.name!r} router: {exc}") from exc
        return specs

    @observe.network_submit
    def submit(self, network: Any, message: Any = None, *, context: dict[str, Any] | None = None,
               max_concurrent: int | None = None, stream: bool = True, run_id: str | None = None,
               pinned: bool | None = None) -> RunHandle:
        """Store the run and enqueue its first tasks, all or nothing (network/submitting.py):
        on any failure what was written is removed and the error raised (Redis out of memory:
        :class:`~robot_lab.errors.RedisOutOfMemory`). The run records this process's build of
        its app; ``pinned`` (default: :func:`~robot_lab.network.builds.default_pinned`) keeps
        its tasks on workers of that build."""
        graph = network.validate() if hasattr(network, "validate") else compile_network(network)
        specs = self.resolve_robots(network, graph)

        run_id = run_id or new_id()
        limit = max_concurrent if max_concurrent is not None else graph.spec.config.max_concurrent_robots
        store = RunStore(self.connection, self.keys, run_id)
        items: list[tuple[str, str, str]] = []
        build = build_for_app(graph.spec.app)
        pinned = default_pinned(graph.spec.app) if pinned is None else pinned
        try:
            with out_of_memory(f"network run {run_id} of {graph.spec.name!r}"):
                publish_specs(list(specs.values()), connection=self.connection, keys=self.keys)
                items = store.create(
                    graph,
                    message=message,
                    context=dict(context or {}),
                    app=graph.spec.app,
                    max_concurrent=limit,
                    robots={name: msgspec.json.encode(spec).decode() for name, spec in specs.items()},
                    stream=stream,
                    build=build,
                    pinned=pinned,
                )
                enqueue_jobs(self.connection, self.keys, run_id, items, graph, build=build)
                self.connection.hdel(store.key, SUBMITTING)  # HDEL runs under maxmemory too
        except BaseException:
            try:
                discard(self.connection, self.keys, run_id, [job for _, job, _ in items])
            except Exception as exc:  # noqa: BLE001 - Redis away: the sweepers remove it (GRACE)
                log.warning("run.submit_cleanup_failed", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
            raise
        log.info("run.submitted", run_id=run_id, network=graph.spec.name, queued=[t for t, _, _ in items])
        return RunHandle(self, run_id)

    def resolve_run_id(self, given: str) -> str:
        """A run id, or the end of one (the dashboard and `runs` tables show the last 12
        characters) when exactly one run of the index ends with it."""
        if len(given) >= 36 or self.connection.exists(self.keys.run(given)):
            return given
        found = sorted({_s(member) for member, _ in self.connection.zscan_iter(
            self.keys.runs_index(), match=f"*{_glob_escape(given)}", count=1000)})
        if len(found) == 1:
            return found[0]
        if found:
            raise ConfigurationError(f"run id {given!r} is ambiguous: {', '.join(found[:5])}"
                                     f"{' ...' if len(found) > 5 else ''} (give more of it)")
        return given  # unknown: attach() / cancel() say so

    def attach(self, run_id: str) -> RunHandle:
        handle = RunHandle(self, self.resolve_run_id(run_id))
        handle.store.meta()  # raises a clear error for an unknown run
        return handle

    def cancel(self, run_id: str, reason: str = "cancelled by user") -> str:
        store = RunStore(self.connection, self.keys, self.resolve_run_id(run_id))
        store.meta()
        status = store.cancel(reason)
        store.finish_housekeeping()
        return status

    def rerun(self, run_id: str, task: str) -> str:
        """Run failed ``task`` of ``run_id`` again (the tasks after it too); returns ``ok``
        or why it was refused (:meth:`RunStore.rerun`). The run is swept and followed again
        like a new one."""
        store = RunStore(self.connection, self.keys, run_id)
        store.meta()  # a clear error for an unknown run
        status, reset, items = store.rerun(task)
        if status != "ok":
            return status
        # the tasks that run again start afresh: their step journals hold the old attempts' steps,
        # which the new inputs would not match (docs/durable.md)
        self.connection.delete(*[self.keys.run_steps(run_id, name) for name in reset])
        self.connection.sadd(self.keys.runs_active(), run_id)  # another slot than the run: after the script
        enqueue_jobs(self.connection, self.keys, run_id, items, graph_for(store))
        log.info("run.rerun", run_id=run_id, task=task, queued=[t for t, _, _ in items])
        return status

    # --- sweeping -------------------------------------------------------------------------
    def sweep_run(self, run_id: str, *, paced: bool = False) -> int:
        """Requeue this run's lost tasks; returns how many jobs were enqueued. ``paced``: only
        when no process swept the run within its interval (``SWEEP_EVERY``, longer for a run
        with many tasks in hand: ``SWEEP_MS_PER_TASK``; ``R:swept``), as followers and
        sweepers do."""
        store = RunStore(self.connection, self.keys, run_id)
        status, active = (_text(v) for v in self.connection.hmget(store.key, "status", "active"))
        if status != "running":
            return 0
        if paced:
            interval_ms = max(SWEEP_EVERY * 1000, int(active or 0) * SWEEP_MS_PER_TASK)
            if not self.connection.set(f"{store.key}:swept", "1", nx=True, px=int(interval_ms)):
                return 0
        view = store.sweep_view()  # one read for the three checks (reclaim only touches running tasks)
        lost = store.lost_attempts(view)
        for task, job_id in lost:
            # a dead worker's budget reservations go back before its task is re-run
            released = release_holder(self.connection, store.budget_holds_key(job_id))
            if released:
                log.warning("run.budget_released", run_id=run_id, task=task, job_id=job_id, released=released)
        # (with none lost, an advance: cheap, and it queues what a parked task's slot let through)
        items = store.reclaim(tasks=[task for task, _ in lost]) if lost else store.advance()
        if "waiting" in view.states.values():  # answered but not resumed (a crash in between), timed out
            waiting.repair(store)
            waiting.sweep(self.connection, self.keys)
        # a job off its queue that no live worker holds yet: stranded once two sweeps a task
        # lease apart saw it so -- a starved worker's pop and hold lie apart by no more than
        # its beats do (2 s requeued live jobs under load; lease.py: the stall margin)
        items += store.repair_queued(grace=task_lease_ms() / 1000, view=view)
        for task, job_id, error in store.failed_jobs(view):
            hint = ""
            if "Deserializ" in error or "pickle" in error.lower():
                hint = " -- the worker could not decode the job; start it as `rq worker robot:<name>` (no -S) or `robot-lab worker`"
            text = f"Error: WorkerError: rq could not run job {job_id}: {error}{hint}"
            result = RobotResult(robot_name=graph_for(store).tasks[task].robot,
                                 output=[TextMessage(content=text)], error=text, stop_reason="error")
            log.warning("run.job_failed_in_rq", run_id=run_id, task=task, error=error)
            _, _, more = store.complete(task, job_id, result, data={"error": text})
            items += more
        if items:
            log.warning("run.requeued", run_id=run_id, tasks=[t for t, _, _ in items])
            enqueue_jobs(self.connection, self.keys, run_id, items, graph_for(store))
        return len(items)

    def sweep(self, *, min_interval_ms: int = 500) -> int:
        """Sweep every active run, at most once per ``min_interval_ms`` across processes."""
        lock = f"{self.keys.prefix}:runs:sweep-lock"
        if not self.connection.set(lock, "1", nx=True, px=min_interval_ms):
            return 0
        total = 0
        for raw in self.connection.smembers(self.keys.runs_active()):
            run_id = raw.decode() if isinstance(raw, bytes) else raw
            store = RunStore(self.connection, self.keys, run_id)
            status, submitting = (_text(v) for v in self.connection.hmget(store.key, "status", SUBMITTING))
            if status is None or submitting is not None:  # maybe what a failed submit left
                if sweep_leftover(self.connection, self.keys, run_id, status, submitting) or status is None:
                    continue
            if status != "running":
                store.finish_housekeeping()
                continue
            try:
                total += self.sweep_run(run_id, paced=True)
            except Exception as exc:  # one broken run must not stop the sweep of the others
                if is_outage(exc):
                    raise  # Redis is away for every run: the caller backs off
                log.warning("run.sweep_failed", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        total += waiting.sweep(self.connection, self.keys)  # input requests past their input_timeout
        total += requeue_handed_back(self.connection, self.keys)  # tasks whose build has a worker again
        return total

    def runs(self, limit: int = 20) -> list[dict[str, Any]]:
        """The most recent runs (id, network, status)."""
        out = []
        for raw in self.connection.zrevrange(self.keys.runs_index(), 0, limit - 1):
            run_id = raw.decode() if isinstance(raw, bytes) else raw
            store = RunStore(self.connection, self.keys, run_id)
            meta = self.connection.hmget(store.key, "network", "status", "created_at")
            if meta[0] is None:
                continue
            out.append({"run_id": run_id, "network": meta[0].decode(), "status": meta[1].decode(),
                        "created_at": float(meta[2] or 0)})
        return out



def _event_name(entry: Any) -> str:
    """The event name of a raw stream entry (one decode)."""
    return msgspec.json.decode(entry[1][b"event"], type=RunEvent).event


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis MATCH pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


__all__ = ["Coordinator", "NetworkResult", "RunHandle", "is_embedded"]
