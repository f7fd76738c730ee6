"""The Lua transitions of a network run: every state change is one script.

Why Lua: two parents finishing at the same moment must not both enqueue their child, a
claimed task must not be claimed twice, and each state change must be written together with
its event. One script per transition gives all three without WATCH/MULTI retries.

Every script starts with the shared library ``_LIB`` (``st``, ``emit``, ``graph``,
``advance``) and takes ``ARGV[1]`` = the run id and, as ``KEYS``, every key it touches:
the ten keys of :data:`RUN_KEY_SUFFIXES` (``KEYS[1]`` = the run hash) and then lease keys
-- the lease of ``ARGV[2]`` for CLAIM, START_TASK, COMPLETE and RELEASE, the lease of every task in the
run's order for RECLAIM. No script builds a key name, so each is correct under Redis Cluster
rules (all the run's keys share its hash tag, so they sit in one slot). The key layout and
the task states are described in :mod:`.run_state`, which is the only caller.
``advance()`` moves pending tasks to ready/skipped, queues ready ones up to
``max_concurrent`` and returns ``task, job_id, robot`` triples the caller must enqueue.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

_SCRIPT_SHAS: dict[str, str] = {}

# KEYS[1..10] of every script, in this order (suffixes of the run key).
RUN_KEY_SUFFIXES = ("", ":graph", ":state", ":jobs", ":attempts", ":queued_at", ":results", ":activated", ":events",
                    ":inputs")
LEASE_KEYS_FROM = len(RUN_KEY_SUFFIXES) + 1  # KEYS index of the first lease key

_LIB = r"""
local R, GRAPH, STATE, JOBS, ATTEMPTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local QUEUED_AT, RESULTS, ACTIVATED, EVENTS, INPUTS = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local RUN_ID = ARGV[1]
local TERMINAL = {done=true, failed=true, skipped=true, cancelled=true}
-- Task states are read through a per-call cache (S): advance() loads the whole hash with one
-- HGETALL instead of an HGET per task per pass (O(tasks) calls made a 200-task run's scripts
-- cost 1.2 ms each); every write goes through set_st so the cache stays the truth.
local S, S_ALL = {}, false
local function st(t)
  local s = S[t]
  if s == nil then
    if S_ALL then return false end
    s = redis.call('HGET', STATE, t)
    S[t] = s
  end
  return s
end
local function load_states()
  if S_ALL then return end
  local flat = redis.call('HGETALL', STATE)
  for i = 1, #flat, 2 do S[flat[i]] = flat[i + 1] end
  S_ALL = true
end
local function set_st(t, v)
  redis.call('HSET', STATE, t, v)
  S[t] = v
end
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
  redis.call('XADD', EVENTS, '*', 'event', table.concat(parts))
end
-- How a finished run ends (every task terminal): 'completed' when no task failed, else
-- 'completed_with_errors' -- a failing robot does not stop the run, but the run must not
-- read as a success. The task counts go on the run record and into run.completed's data,
-- so listings and watchers need not read the task states.
local function finish_run(order, ts)
  local counts = {done = 0, failed = 0, skipped = 0, cancelled = 0}
  for _, t in ipairs(order) do
    local s = st(t)
    counts[s] = (counts[s] or 0) + 1
  end
  local status = 'completed'
  if counts.failed > 0 then status = 'completed_with_errors' end
  redis.call('HSET', R, 'status', status, 'finished_at', tostring(ts), 'tasks_done', counts.done,
             'tasks_failed', counts.failed, 'tasks_skipped', counts.skipped)
  emit('run.completed', nil, nil, '{"status":' .. cjson.encode(status) .. ',"done":' .. counts.done ..
       ',"failed":' .. counts.failed .. ',"skipped":' .. counts.skipped .. '}')
  emit('stream.ended', nil, nil, nil)
end
local G = {}  -- decoded graph entries, per call
local function graph(t)
  local g = G[t]
  if g == nil then
    g = cjson.decode(redis.call('HGET', GRAPH, t))
    G[t] = g
  end
  return g
end
local function advance()
  load_states()
  local order = cjson.decode(redis.call('HGET', R, 'order'))
  local changed = true
  while changed do
    changed = false
    for _, t in ipairs(order) do
      if st(t) == 'pending' then
        local g = graph(t)
        local new = nil
        if g.optional then
          if redis.call('SISMEMBER', ACTIVATED, t) == 1 then
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
          set_st(t, new)
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
      local attempt = redis.call('HINCRBY', ATTEMPTS, t, 1)
      local job = 'rl-' .. RUN_ID .. '-' .. t .. '-' .. attempt
      local g = graph(t)
      set_st(t, 'queued')
      redis.call('HSET', JOBS, t, job)
      redis.call('HSET', QUEUED_AT, t, tostring(ts))
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
  if finished then finish_run(order, ts) end
  return out
end
"""

ADVANCE = _LIB + "\nreturn advance()\n"

START = _LIB + r"""
if redis.call('HGET', R, 'status') ~= 'running' then return {} end
if redis.call('HGET', R, 'started') then return {} end
redis.call('HSET', R, 'started', '1')
emit('run.started', nil, nil, ARGV[2])
return advance()
"""

_CLAIM_FN = r"""
local function claim(t, job, worker, lease_ms)
  local s = st(t)
  if not s then return 'unknown' end
  if TERMINAL[s] then return 'finished' end
  if redis.call('HGET', R, 'status') ~= 'running' then return 'cancelled' end
  if redis.call('HGET', JOBS, t) ~= job then return 'stale' end
  local lease = KEYS[11]
  if s == 'running' and redis.call('EXISTS', lease) == 1 and redis.call('GET', lease) ~= worker then
    return 'busy'
  end
  if s ~= 'queued' and s ~= 'running' then return 'not-ready' end
  set_st(t, 'running')
  redis.call('SET', lease, worker, 'PX', lease_ms)
  local attempt = redis.call('HGET', ATTEMPTS, t) or '1'
  emit('task.started', t, graph(t).robot,
       '{"worker":' .. cjson.encode(worker) .. ',"job_id":' .. cjson.encode(job) .. ',"attempt":' .. attempt .. '}')
  return 'ok'
end
"""

# ARGV: run_id, task, job_id, worker, lease_ms; KEYS[11] the task's lease
CLAIM = _LIB + _CLAIM_FN + r"""
return claim(ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]))
"""

# ARGV: run_id, task, job_id, worker, lease_ms, run fields (JSON list); KEYS[11] the task's
# lease -- the claim plus what the task reads before its robot runs, in the same round trip:
# {status} or {'ok', the run record's fields, the parents' results (a routed task: its
# activators' inputs)}
START_TASK = _LIB + _CLAIM_FN + r"""
local t = ARGV[2]
local status = claim(t, ARGV[3], ARGV[4], tonumber(ARGV[5]))
if status ~= 'ok' then return {status} end
local fields = cjson.decode(ARGV[6])
local g = graph(t)
local sources, hash = g.deps, RESULTS
if g.optional then sources, hash = g.activators, INPUTS end
local values = {}
if #sources > 0 then values = redis.call('HMGET', hash, unpack(sources)) end
local meta = {}
if #fields > 0 then meta = redis.call('HMGET', R, unpack(fields)) end
return {'ok', meta, values}
"""

# ARGV: run_id, task, job_id, result_json, outcome, activations_json, event_data_json, usage_json,
#       has_input ('1' or '0'), input, then event name / data_json pairs -- the events the task
#       still owes (its last text.delta, memory.changed), emitted first (not by a duplicate or
#       stale attempt), so a task's end costs one round trip however many events it ends with;
# KEYS[11] the task's lease
COMPLETE = _LIB + r"""
local t, job, result, outcome = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local s = st(t)
if not s then return {'unknown'} end
if TERMINAL[s] then return {'duplicate'} end
if redis.call('HGET', JOBS, t) ~= job then return {'stale'} end
for i = 11, #ARGV, 2 do
  emit(ARGV[i], t, graph(t).robot, ARGV[i + 1] ~= '' and ARGV[i + 1] or nil)
end
if ARGV[9] == '1' then redis.call('HSET', INPUTS, t, ARGV[10]) end
redis.call('HSET', RESULTS, t, result)
set_st(t, outcome)
redis.call('DEL', KEYS[11])
local ignored = {}
for _, name in ipairs(cjson.decode(ARGV[6])) do
  local raw = redis.call('HGET', GRAPH, name)
  local ok = false
  if raw then
    local g = cjson.decode(raw)
    if g.optional then
      for _, a in ipairs(g.activators) do if a == t then ok = true end end
    end
  end
  if ok then redis.call('SADD', ACTIVATED, name) else table.insert(ignored, name) end
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

# ARGV: run_id, task, job_id, data_json -- a retryable failure: back to queued for rq's retry;
# KEYS[11] the task's lease
RELEASE = _LIB + r"""
local t, job = ARGV[2], ARGV[3]
if st(t) ~= 'running' or redis.call('HGET', JOBS, t) ~= job then return 0 end
set_st(t, 'queued')
redis.call('HSET', QUEUED_AT, t, tostring(now()))
redis.call('DEL', KEYS[11])
emit('task.retrying', t, graph(t).robot, ARGV[4])
return 1
"""

# ARGV: run_id, max_attempts; KEYS[11..]: the lease of each task of the run's order, in order.
# Running tasks whose lease expired go back to ready, then advance.
RECLAIM = _LIB + r"""
if redis.call('HGET', R, 'status') ~= 'running' then return {} end
local order = cjson.decode(redis.call('HGET', R, 'order'))
if #KEYS ~= 10 + #order then return redis.error_reply('RECLAIM needs the lease key of every task') end
load_states()
for i, t in ipairs(order) do
  if st(t) == 'running' and redis.call('EXISTS', KEYS[10 + i]) == 0 then
    local attempts = tonumber(redis.call('HGET', ATTEMPTS, t) or '0')
    local max_attempts = tonumber(ARGV[2] or '0')
    if max_attempts > 0 and attempts >= max_attempts then
      -- a task that keeps killing its workers (or cannot even load) must not loop forever
      local robot = graph(t).robot
      local text = 'Error: WorkerLost: task ' .. t .. ' lost its worker ' .. attempts ..
                   ' times (max_attempts ' .. max_attempts .. ')'
      redis.call('HSET', RESULTS, t, cjson.encode({robot_name = robot, error = text,
                 stop_reason = 'error', output = {{type = 'text', content = text}}}))
      set_st(t, 'failed')
      emit('task.failed', t, robot, cjson.encode({error = text}))
    else
      set_st(t, 'ready')
      emit('task.retrying', t, graph(t).robot,
           '{"reason":"worker lost (lease expired)","job_id":' .. cjson.encode(redis.call('HGET', JOBS, t)) .. '}')
    end
  end
end
return advance()
"""

# ARGV: run_id, reason
CANCEL = _LIB + r"""
local status = redis.call('HGET', R, 'status')
if status ~= 'running' then return status or 'unknown' end
redis.call('HSET', R, 'status', 'cancelled', 'finished_at', tostring(now()))
local order = cjson.decode(redis.call('HGET', R, 'order'))
load_states()
for _, t in ipairs(order) do
  local s = st(t)
  if s == 'pending' or s == 'ready' or s == 'queued' or s == 'waiting' then
    set_st(t, 'cancelled')
  end
end
emit('run.cancelled', nil, nil, '{"reason":' .. cjson.encode(ARGV[2]) .. '}')
emit('stream.ended', nil, nil, nil)
return 'cancelled'
"""

# ARGV: run_id, task -- run a failed task again (an operator's "re-run", e.g. from the
# dashboard), as a new attempt. Everything downstream of it (dependents, and optional tasks
# it could activate, transitively) goes back to pending with its result, input and activation
# dropped, so it runs on the new result; the run is running again until advance() finishes it
# anew. Refused while a downstream task is queued or running, and for a cancelled run.
RERUN = _LIB + r"""
local t = ARGV[2]
local status = redis.call('HGET', R, 'status')
if not status then return {'unknown'} end
if status == 'cancelled' then return {'cancelled'} end
local s = st(t)
if not s then return {'unknown-task'} end
if s ~= 'failed' then return {'not-failed'} end
load_states()
local order = cjson.decode(redis.call('HGET', R, 'order'))
local reset, changed = {[t] = true}, true
while changed do
  changed = false
  for _, n in ipairs(order) do
    if not reset[n] then
      local g = graph(n)
      local parents = g.deps
      if g.optional then parents = g.activators end
      for _, p in ipairs(parents) do
        if reset[p] then reset[n] = true; changed = true; break end
      end
    end
  end
end
local names = {}
for _, n in ipairs(order) do
  if reset[n] then
    if st(n) == 'queued' or st(n) == 'running' then return {'busy', n} end
    table.insert(names, n)
  end
end
for _, n in ipairs(names) do
  set_st(n, n == t and 'ready' or 'pending')
  redis.call('HDEL', RESULTS, n)
  redis.call('HDEL', INPUTS, n)
  redis.call('SREM', ACTIVATED, n)
end
redis.call('HSET', R, 'status', 'running')
redis.call('HDEL', R, 'finished_at', 'tasks_done', 'tasks_failed', 'tasks_skipped')
emit('task.rerun', t, graph(t).robot, '{"reset":' .. cjson.encode(names) .. '}')
local out = advance()
for i = #names, 1, -1 do table.insert(out, 1, names[i]) end
table.insert(out, 1, tostring(#names))
table.insert(out, 1, 'ok')
return out
"""

EMIT = _LIB + r"""
emit(ARGV[2], ARGV[3] ~= '' and ARGV[3] or nil, ARGV[4] ~= '' and ARGV[4] or nil, ARGV[5] ~= '' and ARGV[5] or nil)
return 1
"""


def sha_of(script: str) -> str:
    """The SHA1 Redis caches ``script`` under (memoized)."""
    sha = _SCRIPT_SHAS.get(script)
    if sha is None:
        sha = _SCRIPT_SHAS[script] = hashlib.sha1(script.encode()).hexdigest()
    return sha


def run_script(connection: RedisClient, script: str, keys: list[str], run_id: str, *argv: Any) -> Any:
    """EVALSHA ``script`` on the run's ``keys`` (see the module docstring), falling back to
    EVAL (which caches it) on NOSCRIPT."""
    if hasattr(connection, "command_stack"):  # a pipeline (connection.durable): no NOSCRIPT round trip
        return connection.eval(script, len(keys), *keys, run_id, *argv)
    try:
        return connection.evalsha(sha_of(script), len(keys), *keys, run_id, *argv)
    except NoScriptError:
        return connection.eval(script, len(keys), *keys, run_id, *argv)
