"""Lua scripts that make every memory write atomic with its change record.

Why Lua and not MULTI: a write must read the previous value (for ``MemoryChange.previous``
and for compare-and-set), bump the scope's version, append to the change stream and publish,
all without another client interleaving. A script does that in one round trip; WATCH/MULTI
would need two plus retries.

All three keys of a scope (hash, version counter, change stream) share one hash tag in
cluster mode (see :class:`robot_lab.keys.Keys`), so these multi-key scripts stay legal.

The change JSON is assembled by string concatenation from pieces that Python has already
JSON-encoded (key, value, scope, the writer/network/timestamp suffix) plus the raw previous
value read from the hash, so Lua never parses JSON on the write path. The same bytes go to
the stream entry (field ``c``) and to the pub/sub channel, and decode directly into
:class:`robot_lab.schemas.MemoryChange`. The stream entry id is ``<version>-0``, so a reader
catches up from version ``v`` with ``XRANGE changes (v+1)-0 +``.
"""

from __future__ import annotations

# KEYS: hash, version, changes
# ARGV: channel, maxlen, meta_suffix, scope_json, n, then n groups of
#       (field, key_json, value_json, mode, expected)
# mode: "0" unconditional, "1" field must be absent, "2" field must equal `expected`.
# All compare-and-set checks run before any write, so a multi-key write is all-or-nothing.
# Returns {1, last_version} or, on a failed check, {0, index, current_raw_or_nothing}.
WRITE = r"""
local n = tonumber(ARGV[5])
for i = 0, n - 1 do
  local b = 6 + i * 5
  local mode = ARGV[b + 3]
  if mode ~= '0' then
    local cur = redis.call('HGET', KEYS[1], ARGV[b])
    if mode == '1' then
      if cur then return {0, i, cur} end
    elseif cur ~= ARGV[b + 4] then
      if cur then return {0, i, cur} end
      return {0, i}
    end
  end
end
local v = 0
for i = 0, n - 1 do
  local b = 6 + i * 5
  local prev = redis.call('HGET', KEYS[1], ARGV[b])
  redis.call('HSET', KEYS[1], ARGV[b], ARGV[b + 2])
  v = redis.call('INCR', KEYS[2])
  local change = '{"key":' .. ARGV[b + 1] .. ',"scope":' .. ARGV[4] .. ',"version":' .. v
    .. ',"op":"set","value":' .. ARGV[b + 2] .. ',"previous":' .. (prev or 'null') .. ARGV[3]
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], v .. '-0', 'c', change)
  redis.call('PUBLISH', ARGV[1], change)
end
return {1, v}
"""

# KEYS: hash, version, changes
# ARGV: channel, maxlen, meta_suffix, scope_json, mode, then fields
# mode "keys": delete the listed fields; "clear": every field except the listed (reserved)
# ones; "all": every field. Each removed field gets its own ``deleted`` change.
# Returns {removed_count, last_version, prev_raw_of_first_field_or_nothing}.
DELETE = r"""
local mode = ARGV[5]
local fields = {}
if mode == 'keys' then
  for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
else
  local keep = {}
  if mode == 'clear' then
    for i = 6, #ARGV do keep[ARGV[i]] = true end
  end
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[f] then fields[#fields + 1] = f end
  end
end
local removed = 0
local first = false
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
for idx, f in ipairs(fields) do
  local prev = redis.call('HGET', KEYS[1], f)
  if idx == 1 then first = prev end
  if prev then
    redis.call('HDEL', KEYS[1], f)
    v = redis.call('INCR', KEYS[2])
    removed = removed + 1
    local change = '{"key":' .. cjson.encode(f) .. ',"scope":' .. ARGV[4] .. ',"version":' .. v
      .. ',"op":"deleted","value":null,"previous":' .. prev .. ARGV[3]
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], v .. '-0', 'c', change)
    redis.call('PUBLISH', ARGV[1], change)
  end
end
if first then return {removed, v, first} end
return {removed, v}
"""
