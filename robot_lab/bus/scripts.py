"""Lua scripts of the bus: each one makes a multi-step change atomic on ONE robot's keys.

Every script touches only keys that start with the robot's inbox key (``KEYS[1]``), so in
cluster mode (``Keys(cluster=True)`` wraps the robot name in a hash tag) they all live in
one slot. Conversation keys are derived inside the scripts as ``KEYS[1] .. ':conv:' .. id``,
which is exactly :meth:`robot_lab.keys.Keys.conversation_lock` (a test pins that), and the
conversation heads hash as ``KEYS[1] .. ':conv-heads'`` (:meth:`Keys.conversation_heads`).

Conversation order: READ appends each conversation entry to its list in stream order; an
entry runs only while it is the list's head (ACQUIRE); COMPLETE / DEAD_LETTER remove it.
The head's "in progress" mark is its pending entry in the group's PEL: it belongs to the
consumer that owns that entry, is kept alive only by that consumer's heartbeat and passes
to another consumer by XAUTOCLAIM once it has been idle for the visibility timeout. The
``:conv-heads`` hash records, per conversation, ``head|since_ms|runner``: the head, since
when it is head (or was last granted to a new runner) and the consumer ACQUIRE granted it
to, so ``robot-lab status`` can tell a head that runs from one nobody runs.

Reply shapes differ a little between Redis and fakeredis inside Lua (an empty XREADGROUP is
``false`` on Redis and ``{}`` on fakeredis; fakeredis flattens the stream level), so the
scripts accept both.
"""

from __future__ import annotations

# Stream ids are "ms-seq"; compare them numerically (ms fits a Lua double exactly).
_ID_HELPERS = """
local function parse_id(s)
  local dash = string.find(s, '-', 1, true)
  if not dash then return tonumber(s), 0 end
  return tonumber(string.sub(s, 1, dash - 1)), tonumber(string.sub(s, dash + 1))
end
local function id_lt(a, b)
  local am, as = parse_id(a)
  local bm, bs = parse_id(b)
  if am ~= bm then return am < bm end
  return as < bs
end
"""

# Conversation heads bookkeeping (see the module docstring). Times are the server's clock.
_CONV_HELPERS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function note_head(inbox, cid)
  local head = redis.call('LINDEX', inbox .. ':conv:' .. cid, 0)
  if head then
    redis.call('HSET', inbox .. ':conv-heads', cid, head .. '|' .. now_ms() .. '|')
  else
    redis.call('HDEL', inbox .. ':conv-heads', cid)
  end
end
local function leave(inbox, cid, entry)
  local ck = inbox .. ':conv:' .. cid
  local was_head = redis.call('LINDEX', ck, 0) == entry
  redis.call('LREM', ck, 1, entry)
  if was_head then note_head(inbox, cid) end
end
"""

# KEYS[1] reply stream. ARGV: envelope, ttl. Append a reply; a missing reply stream is
# created (no group) with a TTL instead of refused, so a reply to a requester that already
# gave up is kept for a while, never lost silently. A stream that has a TTL (a reply stream
# in use) has it pushed out to at least ``ttl`` from now on each reply, so a long-lived reply
# stream does not vanish mid-conversation; a stream without one (a robot's inbox) never
# gets one. (Ordinary publishes need no script: XADD ... NOMKSTREAM refuses an unknown
# inbox atomically.)
APPEND_REPLY = """
local existed = redis.call('EXISTS', KEYS[1])
local id = redis.call('XADD', KEYS[1], '*', 'envelope', ARGV[1])
local ttl = tonumber(ARGV[2])
if existed == 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
else
  local left = redis.call('TTL', KEYS[1])
  if left >= 0 and left < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
return id
"""

# KEYS[1] inbox. ARGV: maxlen. Keep at most ~maxlen entries but never remove an entry that
# some group has not yet delivered or still has pending: the trim threshold is the smaller
# of the maxlen cut-off and every group's oldest pending id / last-delivered id. Removes at
# most 1000 entries per call (bounded work), so the inbox is kept at about maxlen; returns
# how many went. Run by publishers every maxlen/10 publishes
# and by every consumer on each reclaim sweep (so an inbox fed by raw XADD is trimmed too).
TRIM = _ID_HELPERS + """
local maxlen = tonumber(ARGV[1])
local len = redis.call('XLEN', KEYS[1])
if len <= maxlen then return 0 end
local k = math.min(len - maxlen, 1000)
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', k + 1)
local threshold = first[#first][1]
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
for _, g in ipairs(groups) do
  local name, pending, delivered = nil, 0, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'pending' then pending = tonumber(g[i + 1])
    elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if delivered and id_lt(delivered, threshold) then threshold = delivered end
  if pending > 0 then
    local summary = redis.call('XPENDING', KEYS[1], name)
    if summary[2] and id_lt(summary[2], threshold) then threshold = summary[2] end
  end
end
return redis.call('XTRIM', KEYS[1], 'MINID', threshold)
"""

# KEYS[1] inbox. ARGV: group, consumer, count.
# XREADGROUP new entries and, in the same atomic step, append each entry that carries a
# conversation_id to that conversation's ordering list. Because XREADGROUP hands entries
# out in stream order and this runs atomically, every conversation list is in stream
# order no matter how many consumers read concurrently.
# Returns {entries, last_delivered_id}; each entry is {id, fields, conversation_id|false}.
READ = _CONV_HELPERS + """
local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                       'STREAMS', KEYS[1], '>')
local out = {}
if res and #res > 0 then
  local entries = (type(res[1]) == 'string') and res[2] or res[1][2]
  for _, e in ipairs(entries) do
    local fields = e[2]
    local cid = false
    if fields then
      local env = nil
      for i = 1, #fields, 2 do
        if fields[i] == 'envelope' then env = fields[i + 1] end
      end
      if env and string.find(env, 'conversation_id', 1, true) then
        local ok, doc = pcall(cjson.decode, env)
        if ok and type(doc) == 'table' and type(doc['conversation_id']) == 'string'
           and doc['conversation_id'] ~= '' then
          cid = doc['conversation_id']
          if redis.call('RPUSH', KEYS[1] .. ':conv:' .. cid, e[1]) == 1 then
            note_head(KEYS[1], cid)
          end
        end
      end
    else
      fields = {}
    end
    table.insert(out, {e[1], fields, cid})
  end
end
local last = false
if #out == 0 then
  local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
  for _, g in ipairs(groups) do
    local name, delivered = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1]
      elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
    end
    if name == ARGV[1] then last = delivered end
  end
end
return {out, last}
"""

# KEYS[1] inbox. ARGV: group, conversation_id, entry_id, consumer.
# 1 when entry_id may be handled now by this consumer: it is the oldest unacknowledged entry
# of its conversation and this consumer owns it (or the conversation has no list). An entry
# another consumer has reclaimed meanwhile is refused: the head runs only on its owner. A
# head that is no longer pending anywhere (acked by hand, purged, trimmed) is dropped so
# that a conversation can never stall on a ghost. Granting records the runner in the heads
# hash (keeping ``since`` when the same consumer retries the same head).
ACQUIRE = _CONV_HELPERS + """
local ck = KEYS[1] .. ':conv:' .. ARGV[2]
local popped = false
for _ = 1, 1000 do
  local head = redis.call('LINDEX', ck, 0)
  if not head then
    if popped then note_head(KEYS[1], ARGV[2]) end
    return 1
  end
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], head, head, 1)
  local owner = (p and #p > 0) and p[1][2] or nil
  if head == ARGV[3] and owner then
    if owner ~= ARGV[4] then
      if popped then note_head(KEYS[1], ARGV[2]) end
      return 0
    end
    local hk = KEYS[1] .. ':conv-heads'
    local cur = redis.call('HGET', hk, ARGV[2])
    local cur_head, cur_runner = nil, nil
    if cur then cur_head, cur_runner = string.match(cur, '^([^|]*)|[^|]*|(.*)$') end
    if cur_head ~= head or cur_runner ~= ARGV[4] then
      redis.call('HSET', hk, ARGV[2], head .. '|' .. now_ms() .. '|' .. ARGV[4])
    end
    return 1
  end
  if owner then
    if popped then note_head(KEYS[1], ARGV[2]) end
    return 0
  end
  redis.call('LPOP', ck)
  popped = true
  if head == ARGV[3] then  -- ours, but acked meanwhile: nothing to run
    note_head(KEYS[1], ARGV[2])
    return 0
  end
end
return 0
"""

# KEYS[1] inbox. ARGV: group, entry_id, conversation_id ('' for none). XACK + leave the
# conversation in one step, so the next entry of the conversation becomes the head only
# once this one is really acknowledged.
COMPLETE = _CONV_HELPERS + """
local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then leave(KEYS[1], ARGV[3], ARGV[2]) end
return n
"""

# KEYS[1] inbox, KEYS[2] dlq. ARGV: group, entry_id, conversation_id, dlq_maxlen, then
# field/value pairs of the dead letter. Record first, then ack: never acked-and-lost.
DEAD_LETTER = _CONV_HELPERS + """
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then leave(KEYS[1], ARGV[3], ARGV[2]) end
return id
"""

# KEYS[1] inbox. ARGV: group, consumer, entry ids...
# Reset the idle time of entries this consumer still owns (XCLAIM JUSTID does not count a
# delivery); returns the ids it no longer owns (reclaimed by someone else meanwhile).
HEARTBEAT = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p and #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

# KEYS[1] inbox. ARGV: group, consumer, idle_ms, then id/retrycount pairs.
# Graceful stop: mark entries we own but never started as idle for idle_ms and undo the
# delivery count of this delivery, so another consumer's XAUTOCLAIM picks them up at once.
HAND_BACK = """
local n = 0
for i = 4, #ARGV, 2 do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p and #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3],
               'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
    n = n + 1
  end
end
return n
"""

# KEYS[1] inbox. ARGV: group, consumer. Delete a consumer only if it has nothing pending
# (XGROUP DELCONSUMER would otherwise drop its pending entries). -1 when kept.
REAP = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p and #p > 0 then return -1 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
"""

# KEYS[1] outbox entry hash, KEYS[2] its replies list, KEYS[3] its signal list.
# ARGV: reply envelope, ttl, replied_at, reply id. Correlate a reply with a message we
# sent; a redelivered reply (same reply id) is recorded once.
OUTBOX_REPLY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HSETNX', KEYS[1], 'r:' .. ARGV[4], '1') == 0 then return 2 end
redis.call('HSET', KEYS[1], 'status', 'replied', 'replied_at', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'reply_count', 1)
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], '1')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
return 1
"""
