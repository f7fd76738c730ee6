"""The Lua scripts of :class:`~.redis_ledger.RedisLedger`: every change to a shared budget
is one of these, so there is no read-modify-write race between processes.

Hash fields per dimension ``k``: ``limit:k``, ``consumed:k``, ``reserved:k`` (decimal
strings, ``%.17g``), and one field per lease-bound holder, ``holds:<holder>`` = a JSON
object ``{k: amount}`` of what that holder has reserved and not yet settled. ``reserved:k``
is always the total, holders or not; the ``holds:`` fields let a sweeper give back exactly
what a dead worker held, and keep a late reconcile of a holder whose holds were already
given back from taking someone else's reservation.

ARGV[1] of the mutating scripts is the TTL in seconds (0 = none); it is applied only while
the key has no TTL yet, so a "per day" scope expires a fixed time after its first use, not
after its last. ``holder`` is '' for a reservation tied to no lease.
"""

from __future__ import annotations

_LIB = """
local function touch(ttl)
  if tonumber(ttl) > 0 and redis.call('TTL', KEYS[1]) == -1 then
    redis.call('EXPIRE', KEYS[1], ttl)
  end
end
local function num(field)
  return tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
end
local function fmt(x) return string.format('%.17g', x) end
-- what `holder` still holds of dimension k (nil: no holder, so no limit on what it may settle)
local function held(holder, k)
  if holder == '' then return nil end
  local raw = redis.call('HGET', KEYS[1], 'holds:' .. holder)
  if not raw then return 0 end
  return tonumber(cjson.decode(raw)[k] or '0') or 0
end
local function hold(holder, k, delta)
  if holder == '' then return end
  local f = 'holds:' .. holder
  local raw = redis.call('HGET', KEYS[1], f)
  local t = {}
  if raw then t = cjson.decode(raw) end
  local v = (tonumber(t[k] or '0') or 0) + delta
  if v <= 0 then t[k] = nil else t[k] = fmt(v) end
  if next(t) == nil then redis.call('HDEL', KEYS[1], f) else redis.call('HSET', KEYS[1], f, cjson.encode(t)) end
end
local function add_reserved(k, holder, amount)
  redis.call('HSET', KEYS[1], 'reserved:' .. k, fmt(num('reserved:' .. k) + amount))
  hold(holder, k, amount)
end
-- give back up to `amount` of holder's reservation of k; returns what was given back
local function give_back(k, holder, amount)
  local h = held(holder, k)
  if h ~= nil and h < amount then amount = h end
  local r = num('reserved:' .. k) - amount
  if r < 0 then r = 0 end
  redis.call('HSET', KEYS[1], 'reserved:' .. k, fmt(r))
  hold(holder, k, -amount)
  return amount
end
"""

# ARGV: ttl, key, amount, holder -> {0} ok | {1, committed+amount, limit} refused | {2} unlimited
RESERVE = _LIB + """
local limit = redis.call('HGET', KEYS[1], 'limit:' .. ARGV[2])
if not limit then return {2} end
limit = tonumber(limit)
local amount = tonumber(ARGV[3])
local committed = num('consumed:' .. ARGV[2]) + num('reserved:' .. ARGV[2])
if committed + amount > limit then
  return {1, fmt(committed + amount), fmt(limit)}
end
add_reserved(ARGV[2], ARGV[4], amount)
touch(ARGV[1])
return {0}
"""

# One model call's reservation (see RedisLedger.reserve_call for the rule).
# ARGV: ttl, key, amount ('' = all that is free), holder
#   -> {0, reserved} | {1, committed, limit} refused | {2} unlimited | {3, free, in_flight} wait
RESERVE_CALL = _LIB + """
local limit = redis.call('HGET', KEYS[1], 'limit:' .. ARGV[2])
if not limit then return {2} end
limit = tonumber(limit)
local consumed = num('consumed:' .. ARGV[2])
local reserved = num('reserved:' .. ARGV[2])
local free = limit - consumed - reserved
local amount = tonumber(ARGV[3])
local take
if amount ~= nil and amount <= free then
  take = amount
elseif reserved > 0 then
  return {3, fmt(free), fmt(reserved)}
elseif free > 0 then
  take = free
else
  return {1, fmt(consumed + reserved), fmt(limit)}
end
add_reserved(ARGV[2], ARGV[4], take)
touch(ARGV[1])
return {0, fmt(take)}
"""

# ARGV: ttl, key, reserved, actual, holder
RECONCILE = _LIB + """
give_back(ARGV[2], ARGV[5], tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'consumed:' .. ARGV[2], fmt(num('consumed:' .. ARGV[2]) + tonumber(ARGV[4])))
touch(ARGV[1])
return 0
"""

# ARGV: ttl, key, amount, holder
RELEASE = _LIB + """
give_back(ARGV[2], ARGV[4], tonumber(ARGV[3]))
touch(ARGV[1])
return 0
"""

# ARGV: holder -> {k1, amount1, k2, amount2, ...}: everything the holder still held, given back
RELEASE_HOLDER = _LIB + """
local raw = redis.call('HGET', KEYS[1], 'holds:' .. ARGV[1])
if not raw then return {} end
local out = {}
for k, v in pairs(cjson.decode(raw)) do
  give_back(k, ARGV[1], tonumber(v))
  table.insert(out, k)
  table.insert(out, v)
end
redis.call('HDEL', KEYS[1], 'holds:' .. ARGV[1])
return out
"""
