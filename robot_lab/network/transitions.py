"""The Lua transitions of a network run: every state change is one script.

Why Lua: two parents finishing at the same moment must not both enqueue their child, a
claimed task must not be claimed twice, and each state change must be written together with
its event. One script per transition gives all three without WATCH/MULTI retries.

Every script starts with the shared library ``_LIB`` (``st``, ``set_st``, ``emit``, ``graph``,
``advance``) and takes ``ARGV[1]`` = the run id and, as ``KEYS``, every key it touches:
the twelve keys of :data:`RUN_KEY_SUFFIXES` (``KEYS[1]`` = the run hash) and then lease keys
-- the lease of ``ARGV[2]`` for CLAIM, START_TASK, COMPLETE, RELEASE and PARK, the lease of
each task it is given for RECLAIM. No script builds a key name, so each is correct under
Redis Cluster rules (all the run's keys share its hash tag, so they sit in one slot). The
key layout and the task states are described in :mod:`.run_state`, which is the only caller.

No transition reads every task: ``set_st`` keeps the run's counters (tasks open and active,
each task's parents not ended) and its ready set, so a result costs O(its dependents) in
Redis. ``advance()`` looks only at the tasks a change may have made runnable, queues ready
ones up to ``max_concurrent`` and returns ``task, job_id, robot`` triples the caller must
enqueue. START and CANCEL are O(tasks) once per run; so is ``finish_run``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

_SCRIPT_SHAS: dict[str, str] = {}

# KEYS[1..12] of every script, in this order (suffixes of the run key).
RUN_KEY_SUFFIXES = ("", ":graph", ":state", ":jobs", ":attempts", ":queued_at", ":results", ":activated", ":events",
                    ":inputs", ":ready", ":counts")
LEASE_KEYS_FROM = len(RUN_KEY_SUFFIXES) + 1  # KEYS index of the first lease key

_LIB = r"""
local R, GRAPH, STATE, JOBS, ATTEMPTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local QUEUED_AT, RESULTS, ACTIVATED, EVENTS, INPUTS = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local READY, COUNTS, LEASE = KEYS[11], KEYS[12], KEYS[13]
local RUN_ID = ARGV[1]
local TERMINAL = {done=true, failed=true, skipped=true, cancelled=true}
local ACTIVE = {queued=true, running=true}
-- Task states are read through a per-call cache (S); every write goes through set_st, which
-- also keeps the run's counters, so no transition reads every task:
--   R.open / R.active   tasks not terminal / queued or running (finish, max_concurrent)
--   READY               zset of ready tasks by their place in the order (queued first come first)
--   COUNTS l:<t> r:<t>  parents of t not terminal yet / terminal and not skipped
-- A parent's end decrements its dependents' l:, and a dependent whose l: reaches 0 (or that
-- a router activated) is looked at by advance(): a result costs O(its dependents), not
-- O(tasks) -- reading every state after each result made a 1000-task fan-out O(n^2).
local S = {}
local function st(t)
  local s = S[t]
  if s == nil then
    s = redis.call('HGET', STATE, t)
    S[t] = s
  end
  return s
end
local NOW = nil
local function now()  -- one TIME per script: its writes happen at one instant anyway
  if NOW == nil then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  return NOW
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
local G = {}  -- decoded graph entries, per call
local function graph(t)
  local g = G[t]
  if g == nil then
    g = cjson.decode(redis.call('HGET', GRAPH, t))
    G[t] = g
  end
  return g
end
local function parents(g)
  if g.optional then return g.activators end
  return g.deps
end
local CHECK, CHECK_AT = {}, 1  -- tasks advance() must look at (FIFO: parents before children)
local function check(t) table.insert(CHECK, t) end
local function ran(s) return TERMINAL[s] == true and s ~= 'skipped' end  -- a boolean: nil ~= false
local function set_st(t, v)
  local old = st(t)
  redis.call('HSET', STATE, t, v)
  S[t] = v
  if old == v then return end
  if ACTIVE[old] ~= ACTIVE[v] then redis.call('HINCRBY', R, 'active', ACTIVE[v] and 1 or -1) end
  if old == 'ready' then redis.call('ZREM', READY, t) end
  if v == 'ready' then redis.call('ZADD', READY, graph(t).i, t) end
  local ended, ran_delta = 0, 0
  if TERMINAL[old] ~= TERMINAL[v] then ended = TERMINAL[v] and 1 or -1 end
  if ran(old) ~= ran(v) then ran_delta = ran(v) and 1 or -1 end
  if ended ~= 0 then redis.call('HINCRBY', R, 'open', -ended) end
  if ended == 0 and ran_delta == 0 then return end
  for _, c in ipairs(graph(t).dependents) do
    if ran_delta ~= 0 then redis.call('HINCRBY', COUNTS, 'r:' .. c, ran_delta) end
    if ended ~= 0 and redis.call('HINCRBY', COUNTS, 'l:' .. c, -ended) == 0 then check(c) end
  end
end
-- A run written before the counters existed: build them (and each graph entry's place and
-- dependents) from its states, once; every later transition keeps them.
local function upgrade()
  if redis.call('HEXISTS', R, 'open') == 1 then return end
  local raw = redis.call('HGET', R, 'order')
  if not raw then return end
  local order = cjson.decode(raw)
  local kids = {}
  for _, t in ipairs(order) do
    for _, p in ipairs(parents(graph(t))) do
      kids[p] = kids[p] or {}
      table.insert(kids[p], cjson.encode(t))
    end
  end
  local open, active = 0, 0
  for i, t in ipairs(order) do
    local entry = redis.call('HGET', GRAPH, t)
    entry = string.sub(entry, 1, -2) .. ',"i":' .. i .. ',"dependents":[' .. table.concat(kids[t] or {}, ',') .. ']}'
    redis.call('HSET', GRAPH, t, entry)
    G[t] = cjson.decode(entry)
    local s = st(t)
    if not TERMINAL[s] then open = open + 1 end
    if ACTIVE[s] then active = active + 1 end
    if s == 'ready' then redis.call('ZADD', READY, i, t) end
    local left, done = 0, 0
    for _, p in ipairs(parents(G[t])) do
      if not TERMINAL[st(p)] then left = left + 1 elseif ran(st(p)) then done = done + 1 end
    end
    redis.call('HSET', COUNTS, 'l:' .. t, left, 'r:' .. t, done)
    if s == 'pending' then check(t) end
  end
  redis.call('HSET', R, 'open', open, 'active', active)
end
upgrade()
-- How a finished run ends (every task terminal): 'completed' when no task failed, else
-- 'completed_with_errors' -- a failing robot does not stop the run, but the run must not
-- read as a success. The task counts go on the run record and into run.completed's data,
-- so listings and watchers need not read the task states. Once per run: it reads them all.
local function finish_run(ts)
  local counts = {done = 0, failed = 0, skipped = 0, cancelled = 0}
  local flat = redis.call('HGETALL', STATE)
  for i = 2, #flat, 2 do
    local s = flat[i]
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
-- Pending tasks that were checked move to ready/skipped (a skip can make its dependents
-- checked in turn); ready tasks are queued up to max_concurrent; the run finishes when no
-- task is open. Returns the task, job_id, robot triples the caller must enqueue.
local function advance()
  while CHECK_AT <= #CHECK do
    local t = CHECK[CHECK_AT]
    CHECK_AT = CHECK_AT + 1
    if st(t) == 'pending' then
      local g = graph(t)
      local new = nil
      local left = tonumber(redis.call('HGET', COUNTS, 'l:' .. t))
      if g.optional then
        if redis.call('SISMEMBER', ACTIVATED, t) == 1 then new = 'ready' elseif left == 0 then new = 'skipped' end
      elseif left == 0 then
        if #g.deps == 0 or tonumber(redis.call('HGET', COUNTS, 'r:' .. t)) > 0 then new = 'ready' else new = 'skipped' end
      end
      if new then
        set_st(t, new)
        if new == 'skipped' then emit('task.skipped', t, g.robot, nil) end
      end
    end
  end
  local out = {}
  local run = redis.call('HMGET', R, 'status', 'max_concurrent', 'active', 'open')
  if run[1] ~= 'running' then return out end
  local limit = tonumber(run[2] or '0') or 0
  local ready
  if limit <= 0 then
    ready = redis.call('ZRANGE', READY, 0, -1)
  elseif limit > tonumber(run[3]) then
    ready = redis.call('ZRANGE', READY, 0, limit - tonumber(run[3]) - 1)
  else
    ready = {}
  end
  local ts = now()
  for _, t in ipairs(ready) do
    local attempt = redis.call('HINCRBY', ATTEMPTS, t, 1)
    local job = 'rl-' .. RUN_ID .. '-' .. t .. '-' .. attempt
    local g = graph(t)
    set_st(t, 'queued')
    redis.call('HSET', JOBS, t, job)
    redis.call('HSET', QUEUED_AT, t, tostring(ts))
    emit('task.queued', t, g.robot, '{"job_id":' .. cjson.encode(job) .. ',"attempt":' .. attempt .. '}')
    table.insert(out, t)
    table.insert(out, job)
    table.insert(out, g.robot)
  end
  if tonumber(redis.call('HGET', R, 'open')) == 0 then finish_run(ts) end
  return out
end
"""

ADVANCE = _LIB + "\nreturn advance()\n"

START = _LIB + r"""
if redis.call('HGET', R, 'status') ~= 'running' then return {} end
if redis.call('HGET', R, 'started') then return {} end
redis.call('HSET', R, 'started', '1')
emit('run.started', nil, nil, ARGV[2])
for _, t in ipairs(cjson.decode(redis.call('HGET', R, 'order'))) do check(t) end  -- once: the roots go
return advance()
"""

_CLAIM_FN = r"""
local function claim(t, job, worker, lease_ms)
  local s = st(t)
  if not s then return 'unknown' end
  if TERMINAL[s] then return 'finished' end
  if redis.call('HGET', R, 'status') ~= 'running' then return 'cancelled' end
  if redis.call('HGET', JOBS, t) ~= job then return 'stale' end
  local lease = LEASE
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

# ARGV: run_id, task, job_id, worker, lease_ms; LEASE (KEYS[13]) the task's lease
CLAIM = _LIB + _CLAIM_FN + r"""
return claim(ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]))
"""

# ARGV: run_id, task, job_id, worker, lease_ms, run fields (JSON list); LEASE (KEYS[13])
# the task's lease -- the claim plus what the task reads before its robot runs, in the same round trip:
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
# LEASE (KEYS[13]) the task's lease
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
redis.call('DEL', LEASE)
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
# LEASE (KEYS[13]) the task's lease
RELEASE = _LIB + r"""
local t, job = ARGV[2], ARGV[3]
if st(t) ~= 'running' or redis.call('HGET', JOBS, t) ~= job then return 0 end
set_st(t, 'queued')
redis.call('HSET', QUEUED_AT, t, tostring(now()))
redis.call('DEL', LEASE)
emit('task.retrying', t, graph(t).robot, ARGV[4])
return 1
"""

# ARGV: run_id, max_attempts, then the tasks to look at; KEYS[13..]: their leases, in that
# order. Those of them still running whose lease expired go back to ready, then advance.
RECLAIM = _LIB + r"""
if redis.call('HGET', R, 'status') ~= 'running' then return {} end
if #KEYS ~= 12 + #ARGV - 2 then return redis.error_reply('RECLAIM needs the lease key of every task it is given') end
local max_attempts = tonumber(ARGV[2] or '0')
for i = 3, #ARGV do
  local t = ARGV[i]
  if st(t) == 'running' and redis.call('EXISTS', KEYS[10 + i]) == 0 then
    local attempts = tonumber(redis.call('HGET', ATTEMPTS, t) or '0') -
                     tonumber(redis.call('HGET', ATTEMPTS, 'resumed:' .. t) or '0')
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
local flat = redis.call('HGETALL', STATE)
for i = 1, #flat, 2 do
  local t, s = flat[i], flat[i + 1]
  S[t] = s
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
local reset, names = {[t] = true}, {t}
local i = 1
while i <= #names do  -- everything downstream: the dependents' closure
  for _, c in ipairs(graph(names[i]).dependents) do
    if not reset[c] then reset[c] = true; table.insert(names, c) end
  end
  i = i + 1
end
table.sort(names, function(a, b) return graph(a).i < graph(b).i end)  -- in the run's order
for _, n in ipairs(names) do
  if ACTIVE[st(n)] then return {'busy', n} end
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
