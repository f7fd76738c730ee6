"""A network run's state in Redis, and the Lua scripts that move it forward.

The run lives in Redis, not in any process: the coordinator that submitted it, every worker
that finishes one of its tasks, and any watcher can advance it. Each transition is one Lua
script, so two parents finishing at the same moment never enqueue a child twice, a task whose
result is recorded is never claimed again, and every state change and its event are written
together (events carry a per-run monotonic ``seq``).

Keys (``R`` = ``Keys.run(run_id)``, all sharing the run's hash tag in cluster mode)::

    R               hash   network, status, message, context, spec, app, order, seq, ...
    R:graph         hash   task -> {deps, optional, activators, robot} (JSON)
    R:state         hash   task -> pending|ready|queued|running|done|failed|skipped|cancelled
    R:jobs          hash   task -> rq job id of the current attempt
    R:attempts      hash   task -> number of attempts enqueued
    R:queued_at     hash   task -> time the current attempt was enqueued
    R:results       hash   task -> RobotResult JSON
    R:activated     set    optional tasks a router activated
    R:inputs        hash   task -> the message its robot received
    R:lease:<task>  string worker name, PX lease refreshed by the running job's heartbeat
    R:events        stream one field ``event`` = RunEvent JSON
    <prefix>:runs:active  set of run ids not finished (swept for lost workers)

Task states: ``pending`` (waiting for parents / activation) -> ``ready`` (runnable, held back
by ``max_concurrent_robots``) -> ``queued`` (an rq job exists or is about to) -> ``running``
(claimed by a worker holding the lease) -> ``done`` | ``failed``; or ``skipped`` (never
activated, or every parent skipped) and ``cancelled``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import msgspec
from redis.exceptions import NoScriptError

from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys
from robot_lab.schemas import RobotResult, RunEvent
from robot_lab.runtime.network.dag import Graph, NetworkSpec

TERMINAL = frozenset({"done", "failed", "skipped", "cancelled"})
JOB_FUNC = "robot_lab.workers.run_task"
DEFAULT_LEASE_MS = 5000
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_JOB_TIMEOUT = 600
RUN_TTL = 7 * 86_400

_SCRIPT_SHAS: dict[str, str] = {}

_LIB = r"""
local R = KEYS[1]
local RUN_ID = ARGV[1]
local TERMINAL = {done=true, failed=true, skipped=true, cancelled=true}
local function st(t) return redis.call('HGET', R .. ':state', t) end
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- data_json: an already encoded JSON object (or nil)
local function emit(event, task, robot, data_json)
  local seq = redis.call('HINCRBY', R, 'seq', 1)
  local parts = {'{"run_id":', cjson.encode(RUN_ID), ',"event":', cjson.encode(event),
                 ',"seq":', tostring(seq), ',"ts":', string.format('%.6f', now())}
  if task then table.insert(parts, ',"task":'); table.insert(parts, cjson.encode(task)) end
  if robot then table.insert(parts, ',"robot":'); table.insert(parts, cjson.encode(robot)) end
  if data_json then table.insert(parts, ',"data":'); table.insert(parts, data_json) end
  table.insert(parts, '}')
  redis.call('XADD', R .. ':events', '*', 'event', table.concat(parts))
end
local function graph(t) return cjson.decode(redis.call('HGET', R .. ':graph', t)) end
local function advance()
  local order = cjson.decode(redis.call('HGET', R, 'order'))
  local changed = true
  while changed do
    changed = false
    for _, t in ipairs(order) do
      if st(t) == 'pending' then
        local g = graph(t)
        local new = nil
        if g.optional then
          if redis.call('SISMEMBER', R .. ':activated', t) == 1 then
            new = 'ready'
          else
            local all = true
            for _, a in ipairs(g.activators) do
              if not TERMINAL[st(a)] then all = false; break end
            end
            if all then new = 'skipped' end
          end
        else
          local all = true
          local any = (#g.deps == 0)
          for _, d in ipairs(g.deps) do
            local s = st(d)
            if not TERMINAL[s] then all = false; break end
            if s ~= 'skipped' then any = true end
          end
          if all then
            if any then new = 'ready' else new = 'skipped' end
          end
        end
        if new then
          redis.call('HSET', R .. ':state', t, new)
          changed = true
          if new == 'skipped' then emit('task.skipped', t, g.robot, nil) end
        end
      end
    end
  end
  local out = {}
  if redis.call('HGET', R, 'status') ~= 'running' then return out end
  local limit = tonumber(redis.call('HGET', R, 'max_concurrent') or '0') or 0
  local inflight = 0
  for _, t in ipairs(order) do
    local s = st(t)
    if s == 'queued' or s == 'running' then inflight = inflight + 1 end
  end
  local ts = now()
  for _, t in ipairs(order) do
    if st(t) == 'ready' and (limit <= 0 or inflight < limit) then
      local attempt = redis.call('HINCRBY', R .. ':attempts', t, 1)
      local job = 'rl-' .. RUN_ID .. '-' .. t .. '-' .. attempt
      local g = graph(t)
      redis.call('HSET', R .. ':state', t, 'queued')
      redis.call('HSET', R .. ':jobs', t, job)
      redis.call('HSET', R .. ':queued_at', t, tostring(ts))
      inflight = inflight + 1
      emit('task.queued', t, g.robot, '{"job_id":' .. cjson.encode(job) .. ',"attempt":' .. attempt .. '}')
      table.insert(out, t)
      table.insert(out, job)
      table.insert(out, g.robot)
    end
  end
  local finished = true
  for _, t in ipairs(order) do
    if not TERMINAL[st(t)] then finished = false; break end
  end
  if finished then
    redis.call('HSET', R, 'status', 'completed', 'finished_at', tostring(ts))
    emit('run.completed', nil, nil, nil)
    emit('stream.ended', nil, nil, nil)
  end
  return out
end
"""

_ADVANCE = _LIB + "\nreturn advance()\n"

_START = _LIB + r"""
if redis.call('HGET', R, 'status') ~= 'running' then return {} end
if redis.call('HGET', R, 'started') then return {} end
redis.call('HSET', R, 'started', '1')
emit('run.started', nil, nil, ARGV[2])
return advance()
"""

# ARGV: run_id, task, job_id, worker, lease_ms
_CLAIM = _LIB + r"""
local t, job, worker, lease_ms = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local s = st(t)
if not s then return 'unknown' end
if TERMINAL[s] then return 'finished' end
if redis.call('HGET', R, 'status') ~= 'running' then return 'cancelled' end
if redis.call('HGET', R .. ':jobs', t) ~= job then return 'stale' end
local lease = R .. ':lease:' .. t
if s == 'running' and redis.call('EXISTS', lease) == 1 and redis.call('GET', lease) ~= worker then
  return 'busy'
end
if s ~= 'queued' and s ~= 'running' then return 'not-ready' end
redis.call('HSET', R .. ':state', t, 'running')
redis.call('SET', lease, worker, 'PX', lease_ms)
local attempt = redis.call('HGET', R .. ':attempts', t) or '1'
emit('task.started', t, graph(t).robot,
     '{"worker":' .. cjson.encode(worker) .. ',"job_id":' .. cjson.encode(job) .. ',"attempt":' .. attempt .. '}')
return 'ok'
"""

# ARGV: run_id, task, job_id, result_json, outcome, activations_json, event_data_json, usage_json
_COMPLETE = _LIB + r"""
local t, job, result, outcome = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local s = st(t)
if not s then return {'unknown'} end
if TERMINAL[s] then return {'duplicate'} end
if redis.call('HGET', R .. ':jobs', t) ~= job then return {'stale'} end
redis.call('HSET', R .. ':results', t, result)
redis.call('HSET', R .. ':state', t, outcome)
redis.call('DEL', R .. ':lease:' .. t)
local ignored = {}
for _, name in ipairs(cjson.decode(ARGV[6])) do
  local raw = redis.call('HGET', R .. ':graph', name)
  local ok = false
  if raw then
    local g = cjson.decode(raw)
    if g.optional then
      for _, a in ipairs(g.activators) do if a == t then ok = true end end
    end
  end
  if ok then redis.call('SADD', R .. ':activated', name) else table.insert(ignored, name) end
end
if ARGV[8] and ARGV[8] ~= '' then emit('usage.updated', t, graph(t).robot, ARGV[8]) end
local event = 'task.completed'
if outcome == 'failed' then event = 'task.failed' end
emit(event, t, graph(t).robot, ARGV[7])
if redis.call('HGET', R, 'status') ~= 'running' then return {'cancelled'} end
local out = advance()
table.insert(out, 1, cjson.encode(ignored))
table.insert(out, 1, 'ok')
return out
"""

# ARGV: run_id, task, job_id, data_json -- a retryable failure: back to queued for rq's retry
_RELEASE = _LIB + r"""
local t, job = ARGV[2], ARGV[3]
if st(t) ~= 'running' or redis.call('HGET', R .. ':jobs', t) ~= job then return 0 end
redis.call('HSET', R .. ':state', t, 'queued')
redis.call('HSET', R .. ':queued_at', t, tostring(now()))
redis.call('DEL', R .. ':lease:' .. t)
emit('task.retrying', t, graph(t).robot, ARGV[4])
return 1
"""

# ARGV: run_id -- running tasks whose lease expired go back to ready, then advance
_RECLAIM = _LIB + r"""
if redis.call('HGET', R, 'status') ~= 'running' then return {} end
local order = cjson.decode(redis.call('HGET', R, 'order'))
for _, t in ipairs(order) do
  if st(t) == 'running' and redis.call('EXISTS', R .. ':lease:' .. t) == 0 then
    local attempts = tonumber(redis.call('HGET', R .. ':attempts', t) or '0')
    local max_attempts = tonumber(ARGV[2] or '0')
    if max_attempts > 0 and attempts >= max_attempts then
      -- a task that keeps killing its workers (or cannot even load) must not loop forever
      local robot = graph(t).robot
      local text = 'Error: WorkerLost: task ' .. t .. ' lost its worker ' .. attempts ..
                   ' times (max_attempts ' .. max_attempts .. ')'
      redis.call('HSET', R .. ':results', t, cjson.encode({robot_name = robot, error = text,
                 stop_reason = 'error', output = {{type = 'text', content = text}}}))
      redis.call('HSET', R .. ':state', t, 'failed')
      emit('task.failed', t, robot, cjson.encode({error = text}))
    else
      redis.call('HSET', R .. ':state', t, 'ready')
      emit('task.retrying', t, graph(t).robot,
           '{"reason":"worker lost (lease expired)","job_id":' .. cjson.encode(redis.call('HGET', R .. ':jobs', t)) .. '}')
    end
  end
end
return advance()
"""

# ARGV: run_id, reason
_CANCEL = _LIB + r"""
local status = redis.call('HGET', R, 'status')
if status ~= 'running' then return status or 'unknown' end
redis.call('HSET', R, 'status', 'cancelled', 'finished_at', tostring(now()))
local order = cjson.decode(redis.call('HGET', R, 'order'))
for _, t in ipairs(order) do
  local s = st(t)
  if s == 'pending' or s == 'ready' or s == 'queued' then
    redis.call('HSET', R .. ':state', t, 'cancelled')
  end
end
emit('run.cancelled', nil, nil, '{"reason":' .. cjson.encode(ARGV[2]) .. '}')
emit('stream.ended', nil, nil, nil)
return 'cancelled'
"""

_EMIT = _LIB + r"""
emit(ARGV[2], ARGV[3] ~= '' and ARGV[3] or nil, ARGV[4] ~= '' and ARGV[4] or nil, ARGV[5] ~= '' and ARGV[5] or nil)
return 1
"""


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _triples(raw: list[Any]) -> list[tuple[str, str, str]]:
    items = [_decode(v) for v in raw]
    return [(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]


class RunStore:
    """One run's state in Redis: submit, claim, complete, reclaim, cancel, read.

    Methods that may make tasks runnable return ``(task, job_id, robot)`` triples; the
    caller must enqueue them (:func:`enqueue_jobs`) -- a crash in between is repaired by
    :meth:`repair_queued`, and a duplicate job is harmless because claims are checked here.
    """

    def __init__(self, connection: Any, keys: Keys, run_id: str) -> None:
        self.r = connection
        self.keys = keys
        self.run_id = run_id
        self.key = keys.run(run_id)

    # --- scripts ---------------------------------------------------------------------
    def _eval(self, script: str, *argv: Any) -> Any:
        # EVALSHA, falling back to EVAL (which also caches the script) on NOSCRIPT.
        sha = _SCRIPT_SHAS.get(script)
        if sha is None:
            sha = _SCRIPT_SHAS[script] = hashlib.sha1(script.encode()).hexdigest()
        try:
            return self.r.evalsha(sha, 1, self.key, self.run_id, *argv)
        except NoScriptError:
            return self.r.eval(script, 1, self.key, self.run_id, *argv)

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
    ) -> list[tuple[str, str, str]]:
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
                "traceparent": _outgoing_traceparent(),
            },
        )
        pipe.hset(self.key + ":graph", mapping={k: json.dumps(v) for k, v in graph.lua_graph().items()})
        pipe.hset(self.key + ":state", mapping={name: "pending" for name in graph.order})
        pipe.execute()
        data = json.dumps({"network": graph.spec.name, "tasks": graph.order})
        return _triples(self._eval(_START, data))

    # --- worker side -----------------------------------------------------------------
    def claim(self, task: str, job_id: str, worker: str, lease_ms: int = DEFAULT_LEASE_MS) -> str:
        return _decode(self._eval(_CLAIM, task, job_id, worker, lease_ms))

    def heartbeat(self, task: str, worker: str, lease_ms: int = DEFAULT_LEASE_MS) -> bool:
        """Extend the lease; False once it was lost (the task was reclaimed)."""
        return bool(self.r.set(self.key + f":lease:{task}", worker, px=lease_ms, xx=True))

    def complete(
        self,
        task: str,
        job_id: str,
        result: RobotResult,
        *,
        activate: list[str] | None = None,
        data: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> tuple[str, list[str], list[tuple[str, str, str]]]:
        """Record the result and advance. Returns (status, ignored activations, jobs to enqueue)."""
        outcome = "failed" if result.failed else "done"
        raw = self._eval(
            _COMPLETE,
            task,
            job_id,
            msgspec.json.encode(result).decode(),
            outcome,
            json.dumps(activate or []),
            json.dumps(data or {}),
            json.dumps(usage) if usage else "",
        )
        status = _decode(raw[0])
        if status != "ok":
            return status, [], []
        return status, json.loads(_decode(raw[1])), _triples(raw[2:])

    def release(self, task: str, job_id: str, error: str) -> bool:
        return bool(self._eval(_RELEASE, task, job_id, json.dumps({"error": error})))

    def emit(self, event: str, *, task: str | None = None, robot: str | None = None,
             data: dict[str, Any] | None = None) -> None:
        self._eval(_EMIT, event, task or "", robot or "", json.dumps(data) if data else "")

    # --- recovery / control ----------------------------------------------------------
    def reclaim(self, max_attempts: int | None = None) -> list[tuple[str, str, str]]:
        """Running tasks whose lease expired go back to ready (a new attempt); after
        ``max_attempts`` lost workers (``ROBOT_LAB_TASK_MAX_ATTEMPTS``, default 5) the task is
        recorded as failed instead, and the run goes on."""
        if max_attempts is None:
            max_attempts = int(os.environ.get("ROBOT_LAB_TASK_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS))
        return _triples(self._eval(_RECLAIM, max_attempts))

    def advance(self) -> list[tuple[str, str, str]]:
        return _triples(self._eval(_ADVANCE))

    def cancel(self, reason: str = "cancelled") -> str:
        return _decode(self._eval(_CANCEL, reason))

    def repair_queued(self, grace: float = 2.0) -> list[tuple[str, str, str]]:
        """Queued tasks whose rq job vanished (the enqueuer died between script and enqueue)."""
        from rq.job import Job

        out: list[tuple[str, str, str]] = []
        states = self.states()
        queued_at = {k: float(v) for k, v in self._hash("queued_at").items()}
        jobs = self._hash("jobs")
        graph = self._hash("graph")
        for task, state in states.items():
            if state != "queued" or time.time() - queued_at.get(task, 0) < grace:
                continue
            job_id = jobs.get(task)
            if job_id and not Job.exists(job_id, connection=self.r):
                out.append((task, job_id, json.loads(graph[task])["robot"]))
        return out

    def failed_jobs(self) -> list[tuple[str, str, str]]:
        """Queued tasks whose rq job failed *outside* our job function -- e.g. a worker that
        could not deserialize it (a worker started with a foreign ``-S`` serializer). Returns
        (task, job_id, error text)."""
        from rq.job import Job, JobStatus
        from robot_lab.runtime.network.serializer import JobSerializer

        out: list[tuple[str, str, str]] = []
        jobs = self._hash("jobs")
        candidates = [(task, jobs[task]) for task, state in self.states().items()
                      if state == "queued" and jobs.get(task)]
        if not candidates:
            return out
        # one pipelined HGET of each job's status; only failed jobs are loaded in full
        pipe = self.r.pipeline(transaction=False)
        for _, job_id in candidates:
            pipe.hget(Job.key_for(job_id), "status")
        statuses = pipe.execute()
        for (task, job_id), status in zip(candidates, statuses):
            if _decode(status or b"") != JobStatus.FAILED.value:
                continue
            try:
                job = Job.fetch(job_id, connection=self.r, serializer=JobSerializer)
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
        from robot_lab.schemas import RobotSpec

        raw = meta["robots"] if meta is not None and "robots" in meta else self.r.hget(self.key, "robots")
        data = json.loads(raw) if raw else {}
        return {name: msgspec.json.decode(text, type=RobotSpec) for name, text in data.items()}

    def status(self) -> str:
        value = self.r.hget(self.key, "status")
        return _decode(value) if value is not None else "unknown"

    def states(self) -> dict[str, str]:
        return self._hash("state")

    def attempts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._hash("attempts").items()}

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
        for suffix in ("", ":graph", ":state", ":jobs", ":attempts", ":queued_at", ":results",
                       ":activated", ":events", ":inputs"):
            pipe.expire(self.key + suffix, RUN_TTL)
        pipe.execute()


def enqueue_jobs(connection: Any, keys: Keys, run_id: str, items: list[tuple[str, str, str]],
                 graph: Graph | None = None) -> None:
    """Put one rq job per (task, job_id, robot) on queue ``robot:<robot>``.

    The job carries everything a plain ``rq worker robot:<robot>`` needs: the key
    prefix, the run id, the task and the attempt's job id (the robot spec and app path are in
    the run record). Data-only serializer (JobSerializer), function by import path.
    """
    if not items:
        return
    from rq import Queue, Retry
    from robot_lab.runtime.network.serializer import JobSerializer

    pipe = connection.pipeline()
    for task, job_id, robot in items:
        spec = graph.tasks.get(task) if graph is not None else None
        retries = spec.retries if spec is not None else 2
        timeout = int(spec.timeout) if spec is not None and spec.timeout else DEFAULT_JOB_TIMEOUT
        queue = Queue(queue_name(robot), connection=connection, serializer=JobSerializer)
        queue.enqueue_call(
            func=JOB_FUNC,
            args=[keys.prefix, run_id, task, job_id],
            job_id=job_id,
            timeout=timeout,
            result_ttl=300,
            failure_ttl=86_400,
            retry=Retry(max=retries) if retries > 0 else None,
            description=f"robot-lab task {task} of run {run_id} ({robot})",
            pipeline=pipe,
        )
    pipe.execute()


def queue_name(robot: str) -> str:
    """The rq queue of a robot (a name users see: ``robot:billing``)."""
    return f"robot:{robot}"


def _outgoing_traceparent() -> str:
    from robot_lab.tracing import outgoing_traceparent

    return outgoing_traceparent()
