"""The rq job function: run one task of a network run, record its result, advance the DAG.

``robot_lab.workers.run_task(prefix, run_id, task, job_id)`` is everything a job carries
(plain data only, see serializer.py). The robot's spec, the message and the context are read from the run
record, so any worker on queue ``robot:<robot>`` -- ``robot-lab worker`` or a plain
``rq worker`` -- can execute it, provided the robot's tools (and the app named in the
run, if any) are importable there.

Idempotency: the job first *claims* the task (Lua, see run_state.py). A task already done,
a job superseded by a newer attempt, or a task another live worker holds is not run again.
While the robot runs, the process's lease keeper thread keeps a short lease alive; if this process dies the
lease expires and a sweeper requeues the task as a new attempt.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from robot_lab import folded_writes
from robot_lab.connection import adopt_default, get_redis, is_cluster_client
from robot_lab.errors import ConfigurationError, InputRequired, retryable
from robot_lab.keys import Keys, default_keys  # default_keys: Memory.for_robot's layout
from robot_lab.logging import get_logger, log_context
from robot_lab.memory.store import Memory
from robot_lab.memory.values import local_writes
from robot_lab.network import human_input as waiting
from robot_lab.network.builds import hand_back, wrong_build
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.enqueue import enqueue_jobs
from robot_lab.network.graphs import cached_graph, graph_for
from robot_lab.network.lease import DeltaBuffer, LeaseHeartbeat, task_lease_ms
from robot_lab.network.routing import choose_routes, route_tool_for
from robot_lab.network.run_state import RunStore
from robot_lab.observability import metrics
from robot_lab.outage import OutageTracker, caused_by_outage
from robot_lab.rq_connection import data_connection
from robot_lab.runtime.rails.budget import BudgetHolder, RedisLedger, release_holder
from robot_lab.runtime.rails.doom_loop import DEFAULT_THRESHOLD, RedisDoomLoopDetector
from robot_lab.runtime.rails.hooks import HookRegistry, TaskHookContext, hook_scope, run_hooks
from robot_lab.runtime.registry import robot_source
from robot_lab.runtime.run_config import RunConfig
from robot_lab.schemas import RobotResult
from robot_lab.settings import get_settings
from robot_lab.tracing import continue_trace

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.workers")

RESERVED_RUN_KWARGS = frozenset(
    {"tools", "mcp", "network_config", "task_config", "config", "on_content", "extra_tools", "run_id", "task",
     "message", "memory", "network", "hooks", "network_hooks", "budgets", "doom_loop", "conversation_id"}
)
_imported_apps: set[str] = set()
_last_sweep = 0.0
_apps_lock = threading.Lock()


def worker_identity() -> str:
    """Who holds a lease: the rq worker's name when there is one, else host:pid:thread."""
    try:
        job = _current_job()
        if job is not None and job.worker_name:
            return f"{job.worker_name}:{threading.get_ident()}"
    except Exception:
        pass
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _current_job() -> Any:
    from rq import get_current_job  # lazy: start-up time

    return get_current_job()


def _connection(job: Any = None) -> Any:
    if job is not None:
        data = data_connection(job.connection)  # the cluster client behind rq's node connection
        adopt_default(data)  # `rq worker --url` with no REDIS_URL: the robot's memory is here too
        return data

    return get_redis()


class DeferredWrites:
    """Writes queued on a pipeline that is never executed by itself, to go out with the next
    round trip to the same server -- ``robot-lab worker``'s rq start records (started
    registry, job status) ride with the task's claim (RunStore.start_task), one round trip
    per task less. Replaying repeats them (a claim retried through an outage): each is
    idempotent (HSET, ZADD, SADD, EXPIRE, PERSIST, LREM of one id). ``flush`` writes them on
    their own when no claim did."""

    def __init__(self, pipe: Any) -> None:
        self.commands: list[tuple[tuple[Any, ...], dict[str, Any]]] = list(pipe.command_stack)
        self.written = False

    def replay(self, pipe: Any) -> None:
        """Queue the writes on ``pipe`` (the caller sets ``written`` once it executed), as
        they were queued (not built again), folded into one script call
        (robot_lab/folded_writes.py)."""
        folded_writes.queue(pipe, self.commands)

    def flush(self, connection: Any) -> None:
        if self.written:
            return
        pipe = connection.pipeline(transaction=False)
        pipe.command_stack.extend(self.commands)  # as queued: redis-py's stack entries
        pipe.execute()
        self.written = True


def _import_app(path: str) -> None:
    """Import the run's app once per process, for its side effects (scripted-model scripts,
    tools registered at import). A failure is logged; the task may still work without it."""
    with _apps_lock:
        if path in _imported_apps:
            return
        _imported_apps.add(path)
    try:
        robot_source(path)
    except ConfigurationError as exc:
        log.warning("worker.app_import_failed", app=path, error=str(exc))


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The Ruby gem's deep merge: hashes merge recursively, everything else is replaced."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def task_message(graph: Any, task: str, meta: dict[str, str], sources: list[str | None]) -> str:
    """What the task's robot receives (see docs/networks.md, "Context passing"). ``sources``
    are what :meth:`RunStore.start_task` read with the claim: the parents' results, or for a
    routed task its activators' inputs, in graph order (None where there is none)."""
    spec = graph.tasks[task]
    if spec.optional:
        # A router hands the request on: the routed task gets what its activator received
        # (the router's own reply is only its decision).
        return next((raw for raw in sources if raw is not None), "")
    parents = graph.deps[task]
    if not parents:
        message = json.loads(meta.get("message") or "null")
        if message is None:
            return ""
        return message if isinstance(message, str) else json.dumps(message)

    ran = [(p, msgspec.json.decode(raw, type=RobotResult)) for p, raw in zip(parents, sources) if raw is not None]
    if len(ran) == 1:
        return ran[0][1].reply or ""
    return "\n\n".join(f"## {name}\n{result.reply or ''}" for name, result in ran)


@dataclass
class TaskWork:
    """One attempt's data from its claim to its result: what the claim read, the memory
    version the task started at, and what :meth:`RunStore.complete` writes with the result
    (the robot's input, the events not sent yet)."""

    meta: dict[str, str]
    sources: list[str | None]
    since: int | None = None  # None: not read with the claim (first task of a run here)
    learnings: Any = None  # the robot's stored learnings field, read with the claim
    learnings_read: bool = False
    input: str | None = None
    owed: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    steps: Any = None  # the step journal, read with the claim (None: not read)
    journal: Any = None  # the task's step journal (its last step goes out with the result)


# The run record's fields a task reads with its claim ("spec" too while this process has not
# compiled the run's graph yet).
RUN_FIELDS = ["network", "app", "message", "context", "robots", "stream", "traceparent", "build"]


class FinishWrites:
    """``robot-lab worker``'s rq finish records of a job (status, result, finished registry),
    queued in the same pipeline as the task's result (RunStore.complete): the job's end and
    the task's in one round trip. The value they record is the job's return value for an
    ``ok`` result; when the script answers otherwise, the worker records the job's actual
    return value as rq's newest result after (``value`` is what went out here)."""

    def __init__(self, queue: Callable[[Any, Any], None]) -> None:
        self._queue = queue
        self.value: Any = None
        self.pending: Any = None  # the value the next ``queue`` records
        self.written = False  # set by RunStore.complete once the pipeline went out

    def queue(self, pipe: Any) -> None:
        """Queue the records on ``pipe``, folded into one script call (robot_lab/folded_writes.py)."""
        self.value = self.pending
        mark = len(pipe.command_stack)
        self._queue(pipe, self.pending)
        commands = pipe.command_stack[mark:]
        del pipe.command_stack[mark:]
        folded_writes.queue(pipe, commands)


def _start(store: RunStore, task: str, job_id: str, worker: str, lease_ms: int,
           rq_start: DeferredWrites | None = None) -> tuple[Any, list[Any] | None]:
    """Claim the task and read its inputs (one round trip; see RunStore.start_task). With the
    run's graph known here, the task's memory version and its robot's learnings are read in
    the same round trip, and ``rq_start`` (rq's start records, ``robot-lab worker``) is
    written in it."""
    graph = cached_graph(store)
    also = None
    if graph is not None and task in graph.tasks:
        spec = graph.tasks[task]
        version_key = store.keys.memory_version(_memory_scope(store, spec))
        learnings_key = default_keys().memory(f"robot:{spec.robot}")

        steps_key = store.keys.run_steps(store.run_id, task)

        def also(pipe: Any) -> None:
            pipe.get(version_key)
            pipe.hget(learnings_key, "learnings")
            pipe.hgetall(steps_key)  # the task's step journal (runtime/durable)

    before = rq_start.replay if rq_start is not None and not rq_start.written else None
    start = store.start_task(task, job_id, worker, lease_ms, RUN_FIELDS if graph is not None else [*RUN_FIELDS, "spec"],
                             also=also, before=before)
    if before is not None:
        if start.before_written:
            rq_start.written = True  # type: ignore[union-attr]
        elif not is_cluster_client(store.r):  # folded into a script the server lacked: on their own now
            rq_start.flush(store.r)  # type: ignore[union-attr]
    return start, (start.also if also is not None and start.also else None)


def _warm() -> None:
    from robot_lab.runtime import robot  # noqa: F401; lazy: import order


def run_task(prefix: str, run_id: str, task: str, job_id: str) -> dict[str, Any]:
    """The rq job. Returns a small JSON summary (rq stores it as the job result)."""
    _warm()  # heavy imports before the claim: the lease must only cover the robot's work
    job = _current_job()
    connection = _connection(job)
    rq_start = getattr(job, "rq_start", None)  # robot-lab worker's rq records, written with the claim
    rq_finish = getattr(job, "rq_finish", None)  # ... and its end, written with the result

    keys = Keys(prefix=prefix, cluster=get_settings().cluster_keys)  # same layout as the coordinator
    store = RunStore(connection, keys, run_id)
    worker = worker_identity()
    lease_ms = task_lease_ms()
    with log_context(run_id=run_id, task=task):
        # Redis away: wait for it (a claim is re-entrant for the same worker), rather than
        # fail the job in rq and have the sweeper record the task as failed
        outage = OutageTracker(f"task-{task}")  # one lost/back pair per outage for this job
        pinned = outage.call(lambda: wrong_build(connection, keys, run_id))  # a run of another build
        if pinned is not None:
            outage.call(lambda: hand_back(connection, keys, run_id, task, job_id, pinned))
            return {"task": task, "status": "handed_back", "build": pinned}
        start, also = outage.call(lambda: _start(store, task, job_id, worker, lease_ms, rq_start))
        if start.status != "ok":
            log.info("task.not_claimed", reason=start.status, job_id=job_id)
            return {"task": task, "status": start.status}
        work = TaskWork(meta=start.meta, sources=start.sources)
        if also is not None:
            work.since = int(also[0]) if also[0] is not None else 0
            work.learnings, work.learnings_read = also[1], True
            work.steps = also[2]
        with LeaseHeartbeat(store, task, worker, lease_ms, outage) as lease:
            outcome = _execute(store, keys, run_id, task, job_id, worker, work, outage, lease, rq_finish)
        _sweep_soon(connection, keys)
        return outcome


def _execute(store: RunStore, keys: Keys, run_id: str, task: str, job_id: str, worker: str, work: TaskWork,
             outage: OutageTracker | None = None, lease: LeaseHeartbeat | None = None,
             rq_finish: FinishWrites | None = None) -> dict[str, Any]:
    meta = work.meta
    graph = graph_for(store, meta.pop("spec", None))
    spec = graph.tasks[task]
    robot_name = spec.robot
    if meta.get("app"):
        _import_app(meta["app"])
    started = time.monotonic()
    activate: list[str] = []

    with log_context(robot=robot_name), continue_trace(meta.get("traceparent"), "task", flush=True, run_id=run_id,
                                                       task=task, robot=robot_name):
        try:
            result, activate = _run_task_hooks(store, graph, task, job_id, worker, work)
        except InputRequired as exc:  # a person must answer: the task parks, this job ends
            _flush_journal(work)
            _send_owed(store, task, robot_name, work)
            return waiting.park(store, task, job_id, exc)
        except Exception as exc:
            if caused_by_outage(exc):
                # Not the task's fault: no failure is recorded (and no traceback logged by
                # rq); once Redis is back the job ends, its lease expires and the sweeper
                # runs the task again (docs/operations.md, "Failure modes").
                log.warning("task.interrupted_by_redis_outage", error=f"{type(exc).__name__}: {exc}")
                outage = outage or OutageTracker(f"task-{task}")
                outage.lost(exc)
                outage.call(store.r.ping)
                _flush_journal(work)  # the next attempt replays the steps done
                return {"task": task, "status": "interrupted"}
            if retryable(exc) and _retries_left() > 0:
                log.warning("task.retrying", error=f"{type(exc).__name__}: {exc}")
                _flush_journal(work)
                _send_owed(store, task, robot_name, work)
                store.release(task, job_id, f"{type(exc).__name__}: {exc}")
                raise  # rq's Retry re-enqueues the same job id
            log.warning("task.failed", error=f"{type(exc).__name__}: {exc}")
            result = RobotResult.from_error(robot_name, exc)
        result.duration = time.monotonic() - started
        result.activate = activate
        data: dict[str, Any] = {
            "reply": result.reply,
            "duration": round(result.duration, 4),
            "worker": worker,
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
        }
        if result.error:
            data["error"] = result.error
        if result.stop_reason not in (None, "stop", "error"):  # a reply cut at max_tokens says so
            data["stop_reason"] = result.stop_reason
        if activate:
            data["activate"] = activate
        if result.files:  # what the task wrote in the run's workspace (the result keeps them too)
            data["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256, "media_type": f.media_type}
                             for f in result.files]
        if spec.memory_key:
            _write_memory(store, keys, meta, spec.memory_key, result, task)
        usage = None
        if result.input_tokens or result.output_tokens:
            usage = {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
                     "cost": result.cost}
        metrics.task_finished(robot_name, result.failed, result.duration)  # before the run can be seen complete
        # The robot's work is done: a Redis outage now must not throw it away. Both calls
        # are safe to repeat (a repeated complete is refused, the first one counted; a
        # child whose enqueue was lost is re-enqueued by the sweeper's repair of queued tasks).
        outage = outage or OutageTracker(f"task-{task}")
        if lease is not None:
            lease.finishing = True  # the result deletes the lease: a beat racing it finds none
        if rq_finish is not None:  # the job's return value below, for an ok result
            rq_finish.pending = {"task": task, "status": "ok", "failed": result.failed}
        status, ignored, items = outage.call(
            lambda: store.complete(task, job_id, result, activate=activate, data=data, usage=usage,
                                   input=work.input, events=work.owed, after=rq_finish,
                                   journal=work.journal))
        if ignored:
            log.warning("task.activation_ignored", names=ignored, routes=spec.routes)
        if status == "ok":
            outage.call(lambda: enqueue_jobs(store.r, keys, run_id, items, graph, build=meta.get("build") or ""))
        log.info("task.finished", status=status, failed=result.failed, queued=[t for t, _, _ in items])
        return {"task": task, "status": status, "failed": result.failed}


def _retries_left() -> int:
    try:
        from rq import get_current_job  # lazy: start-up time

        job = get_current_job()
        return int(job.retries_left or 0) if job is not None else 0
    except Exception:
        return 0


def _write_memory(store: RunStore, keys: Keys, meta: dict[str, str], key: str, result: RobotResult,
                  task: str) -> None:
    try:
        memory = Memory.for_run(store.run_id, network_name=meta.get("network"), redis=store.r, keys=keys,
                                writer=task)
        memory.set(key, result.reply)
    except Exception as exc:  # memory is a side channel: never lose the task's result over it
        log.warning("task.memory_write_failed", key=key, error=f"{type(exc).__name__}: {exc}")


def _run_task_hooks(store: RunStore, graph: Any, task: str, job_id: str, worker: str, work: TaskWork
                    ) -> tuple[RobotResult, list[str]]:
    """The ``task`` hook family fires here, in the worker, around the robot's run; the
    network's hooks (import paths in its spec) also reach the robot's own families."""
    registry = HookRegistry(graph.spec.hooks)
    spec = graph.tasks[task]
    memory = _task_memory(store, work.meta, spec)
    ctx = TaskHookContext(task=spec, task_name=task, robot=spec.robot, config=graph.spec.config,
                          run_id=store.run_id, memory=memory)
    outcome: dict[str, Any] = {}

    def core() -> RobotResult:
        result, activate = _run_robot(store, graph, task, job_id, worker, memory, work, network_hooks=registry)
        outcome["activate"] = activate
        return result

    try:
        with hook_scope(registry):
            result = run_hooks("task", ctx, core)
    finally:
        memory.close()
    return result, outcome.get("activate", [])


def _run_robot(store: RunStore, graph: Any, task: str, job_id: str, worker: str, memory: Any, work: TaskWork,
               network_hooks: Any = None) -> tuple[RobotResult, list[str]]:
    from robot_lab.runtime.robot import Robot  # lazy: start-up time

    meta = work.meta
    spec = graph.tasks[task]
    robot_spec = store.robot_specs(meta).get(spec.robot)
    if robot_spec is None:
        raise ConfigurationError(f"run {store.run_id}: no spec recorded for robot {spec.robot!r}")
    stream = meta.get("stream", "1") == "1"
    deltas = DeltaBuffer(store, task, spec.robot)

    def on_tool_call(call: Any) -> None:  # after the text and step events before it, in one round trip
        deltas.owe("tool_call.started", {"id": call.id, "name": call.name, "input": call.input})
        deltas.flush()

    def on_tool_result(message: Any) -> None:
        deltas.owe("tool_call.completed", {"id": message.tool.id, "name": message.tool.name,
                                           "output": message.content})
        deltas.flush()

    robot = Robot.from_spec(robot_spec, on_tool_call=on_tool_call, on_tool_result=on_tool_result)
    if work.learnings_read:
        robot.preload_learnings(Memory.for_robot(robot.name, redis=store.r, keys=default_keys()),
                                work.learnings)
    message = task_message(graph, task, meta, work.sources)
    work.input = message  # recorded with the result (RunStore.complete)
    run_context = deep_merge(json.loads(meta.get("context") or "{}"), spec.context)
    context = {k: v for k, v in run_context.items() if k not in RESERVED_RUN_KWARGS}
    # The run plan's layers: the network's config under the robot, the task's above it.
    network_config = RunConfig.from_data(graph.spec.config)
    task_config = RunConfig.from_data(spec.config) if spec.config is not None else None
    combined = network_config.merge(task_config)  # run-wide budgets and loop guard; tools/mcp parents
    tools: Any = spec.tools if spec.tools is not None else (combined.tools or "none")
    mcp: Any = spec.mcp if spec.mcp is not None else (combined.mcp or "none")
    extra = []
    use_llm_router = bool(spec.routes) and spec.router is None
    if use_llm_router:
        route_tool = route_tool_for(spec.routes)
        extra.append(route_tool)
        base = robot.select_tools(tools, network_config=combined)
        tools = [t.name for t in base] + [route_tool.name]

    since = memory.version if work.since is None else work.since
    writes = local_writes(memory.scope)
    budgets = _run_budgets(store, combined, job_id, worker)
    try:  # (the scope inside: a failing journal read still releases the budget holds)
        scope = waiting.task_scope(store, task, spec.robot, deltas, work.steps)
        work.journal = scope.journal
        with robot.shared_mcp():  # a robot per task: its MCP servers are the process's, not its own
            result = robot.run(
                message,
                tools=tools,
                mcp=mcp,
                network_config=network_config,
                task_config=task_config,
                on_content=deltas.add if stream else None,
                extra_tools=extra,
                run_id=store.run_id,
                task=task,
                memory=memory,
                network_hooks=network_hooks,
                budgets=budgets,
                doom_loop=_run_doom_loop(store, combined),
                durable_id=scope,  # step journal, human input
                **context,
            )
    finally:
        # the last text.delta and the memory.changed events go out with the result
        work.owed += deltas.take()
        if local_writes(memory.scope) != writes:  # else nothing this task could have written
            work.owed += _memory_events(spec.robot, memory, since)
        if budgets:  # only a run budget registers holds for this attempt
            _release_budget_holds(store, job_id)
    activate = choose_routes(spec, result, message=message, run_id=store.run_id)
    return result, activate


def _memory_scope(store: RunStore, spec: Any) -> str:
    """The scope of the task's active memory: ``task(memory="scope")``, else the run's."""
    return spec.memory or f"run:{store.run_id}"


def _task_memory(store: RunStore, meta: dict[str, str], spec: Any) -> Any:
    """The task's active memory: ``task(memory="scope")`` names one, else the run's shared
    ``Memory.for_run``; rebuilt from its scope name on this worker's Redis."""
    return Memory(_memory_scope(store, spec), redis=store.r, keys=store.keys, network_name=meta.get("network"))


def _memory_events(robot: str, memory: Any, since: int) -> list[tuple[str, dict[str, Any] | None]]:
    """One ``memory.changed`` event per write this task's robot made (the writer is the
    robot), so a run's events show who wrote what."""
    try:
        return [("memory.changed", {"scope": change.scope, "key": change.key, "op": change.op,
                                    "version": change.version, "writer": change.writer})
                for change in memory.changes(since_version=since) if change.writer == robot]
    except Exception as exc:  # events are a side channel: never lose the task's result over them
        log.warning("task.memory_events_failed", error=f"{type(exc).__name__}: {exc}")
        return []


def _flush_journal(work: TaskWork) -> None:
    """Write the task's pending last step when it ends without a result (parks, retries,
    an outage that interrupted it): the next attempt replays it."""
    if work.journal is None:
        return
    try:
        work.journal.flush()
    except Exception as exc:  # then the next attempt makes that model call again
        log.warning("task.journal_flush_failed", error=f"{type(exc).__name__}: {exc}")


def _send_owed(store: RunStore, task: str, robot: str, work: TaskWork) -> None:
    """Emit the events a task owes when it ends without a result (a retry)."""
    for event, data in work.owed:
        try:
            store.emit(event, task=task, robot=robot, data=data)
        except Exception as exc:  # a side channel, as above
            log.warning("task.events_failed", error=f"{type(exc).__name__}: {exc}")
    work.owed = []


def _run_budgets(store: RunStore, network_config: Any, job_id: str, worker: str) -> list[Any]:
    """A network's ``token_budget``/``cost_budget`` is one ledger for the whole run, shared
    by every worker through Redis (scope ``run:<id>``). Its reservations are held by this
    attempt (job id + worker), so the sweeper gives them back if this worker dies."""
    limits = {k: v for k, v in (("tokens", network_config.token_budget), ("cost", network_config.cost_budget))
              if v is not None}
    if not limits:
        return []

    holder = BudgetHolder(id=f"{job_id}@{worker}", registry=store.budget_holds_key(job_id))
    return [RedisLedger(f"run:{store.run_id}", limits, redis=store.r, keys=store.keys, ttl=7 * 86_400,
                        holder=holder)]


def _release_budget_holds(store: RunStore, job_id: str) -> None:
    """Whatever the attempt still holds once the robot is done (a reconcile that failed, an
    exception between reserve and settle) goes back now, not when the budget expires."""
    try:
        released = release_holder(store.r, store.budget_holds_key(job_id))
        if released:
            log.warning("task.budget_released", released=released)
    except Exception as exc:  # Redis hiccup: the sweeper cannot see this one, the TTL will
        log.warning("task.budget_release_failed", error=f"{type(exc).__name__}: {exc}")


def _run_doom_loop(store: RunStore, network_config: Any) -> Any:
    """The run's tool-call sequence lives in Redis, so a loop bouncing between robots on
    different workers is seen."""
    return RedisDoomLoopDetector(store.run_id, redis=store.r, keys=store.keys,
                                 threshold=network_config.doom_loop_threshold or DEFAULT_THRESHOLD)


# Sweeping inside a job delays that job's completion, so it runs at most every 2 s per
# process; `robot-lab worker` also sweeps from a thread, and waiting coordinators sweep too.
JOB_SWEEP_INTERVAL = 2.0


def _sweep_soon(connection: RedisClient, keys: Keys) -> None:
    """Finishing a task is a good moment to look for lost work in any run (rate-limited
    in this process and, through a Redis lock, across processes)."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep < JOB_SWEEP_INTERVAL:
        return
    _last_sweep = now
    try:
        Coordinator(connection=connection, keys=keys).sweep()
    except Exception as exc:
        log.warning("worker.sweep_failed", error=f"{type(exc).__name__}: {exc}")
