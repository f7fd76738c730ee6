"""Lua scripts of the bus: each one makes a multi-step change atomic on ONE robot's keys.

Every script declares every key it touches in ``KEYS`` and builds no key name of its own,
so it is correct under Redis Cluster's rules (not only by luck of slot placement): all the
keys of one robot share the robot's hash tag in cluster mode (``Keys(cluster=True)``), so
they sit in one slot. ``tests/test_connection_cluster_scripts.py`` checks this statically and against a
real cluster (every command a script runs names only declared keys).

Why one sorted set for all conversations of an inbox rather than one list per
conversation: READ learns the conversation ids only after XREADGROUP, inside the script,
so a per-conversation key could not be declared in advance. The queue
(:meth:`robot_lab.keys.Keys.conversation_queue`) holds one member per queued entry,
``<len(cid)>:<cid>:<ms padded to 20>-<seq padded to 20>``, all with score 0: lexicographic
order then groups each conversation's entries together in stream order, the head is one
``ZRANGEBYLEX ... LIMIT 0 1`` and every step is O(log n). The length prefix keeps a
conversation id that is a prefix of another (``a`` and ``a:b``) apart.

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

Key arguments: ``KEYS[1]`` inbox; READ, ACQUIRE, COMPLETE and DEAD_LETTER also take
``KEYS[2]`` the conversation queue and ``KEYS[3]`` the conversation heads hash
(``conv-heads``); DEAD_LETTER takes the DLQ as ``KEYS[4]``.
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

# Conversation queue and heads bookkeeping (see the module docstring); Q = the queue
# (KEYS[2]), H = the heads hash (KEYS[3]). Times are the server's clock.
_CONV_HELPERS = """
local Q, H = KEYS[2], KEYS[3]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function pad(s) return string.rep('0', 20 - #s) .. s end
local function unpad(s)
  local t = string.gsub(s, '^0+', '')
  if t == '' then return '0' end
  return t
end
local function conv_prefix(cid) return #cid .. ':' .. cid .. ':' end
local function conv_member(cid, id)
  local dash = string.find(id, '-', 1, true)
  return conv_prefix(cid) .. pad(string.sub(id, 1, dash - 1)) .. '-' .. pad(string.sub(id, dash + 1))
end
-- the entry id at the head of conversation cid, or nil
local function conv_head(cid)
  local p = conv_prefix(cid)
  local r = redis.call('ZRANGEBYLEX', Q, '[' .. p, '(' .. p .. '\\255', 'LIMIT', 0, 1)
  if not r or #r == 0 then return nil end
  local rest = string.sub(r[1], #p + 1)
  local dash = string.find(rest, '-', 1, true)
  return unpad(string.sub(rest, 1, dash - 1)) .. '-' .. unpad(string.sub(rest, dash + 1))
end
local function note_head(cid)
  local head = conv_head(cid)
  if head then
    redis.call('HSET', H, cid, head .. '|' .. now_ms() .. '|')
  else
    redis.call('HDEL', H, cid)
  end
end
local function leave(cid, entry)
  local was_head = conv_head(cid) == entry
  redis.call('ZREM', Q, conv_member(cid, entry))
  if was_head then note_head(cid) end
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

# KEYS inbox, queue, heads. ARGV: group, consumer, count.
# XREADGROUP new entries and, in the same atomic step, queue each entry that carries a
# conversation_id in the conversation queue. Because XREADGROUP hands entries out in
# stream order and this runs atomically, no entry of a conversation can become its head
# while an older one is delivered but not yet queued, however many consumers read.
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
          redis.call('ZADD', Q, 0, conv_member(cid, e[1]))
          if conv_head(cid) == e[1] then note_head(cid) end
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

# KEYS inbox, queue, heads. ARGV: group, conversation_id, entry_id, consumer.
# 1 when entry_id may be handled now by this consumer: it is the oldest unacknowledged entry
# of its conversation and this consumer owns it (or the conversation has no entry queued).
# An entry another consumer has reclaimed meanwhile is refused: the head runs only on its
# owner. A head that is no longer pending anywhere (acked by hand, purged, trimmed) is
# dropped so that a conversation can never stall on a ghost. Granting records the runner
# in the heads hash (keeping ``since`` when the same consumer retries the same head).
ACQUIRE = _CONV_HELPERS + """
local cid = ARGV[2]
local popped = false
for _ = 1, 1000 do
  local head = conv_head(cid)
  if not head then
    if popped then note_head(cid) end
    return 1
  end
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], head, head, 1)
  local owner = (p and #p > 0) and p[1][2] or nil
  if head == ARGV[3] and owner then
    if owner ~= ARGV[4] then
      if popped then note_head(cid) end
      return 0
    end
    local cur = redis.call('HGET', H, cid)
    local cur_head, cur_runner = nil, nil
    if cur then cur_head, cur_runner = string.match(cur, '^([^|]*)|[^|]*|(.*)$') end
    if cur_head ~= head or cur_runner ~= ARGV[4] then
      redis.call('HSET', H, cid, head .. '|' .. now_ms() .. '|' .. ARGV[4])
    end
    return 1
  end
  if owner then
    if popped then note_head(cid) end
    return 0
  end
  redis.call('ZREM', Q, conv_member(cid, head))
  popped = true
  if head == ARGV[3] then  -- ours, but acked meanwhile: nothing to run
    note_head(cid)
    return 0
  end
end
return 0
"""

# KEYS inbox, queue, heads. ARGV: group, entry_id, conversation_id ('' for none). XACK + leave the
# conversation in one step, so the next entry of the conversation becomes the head only
# once this one is really acknowledged.
COMPLETE = _CONV_HELPERS + """
local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then leave(ARGV[3], ARGV[2]) end
return n
"""

# KEYS inbox, queue, heads, dlq. ARGV: group, entry_id, conversation_id, dlq_maxlen, then
# field/value pairs of the dead letter. Record first, then ack: never acked-and-lost.
DEAD_LETTER = _CONV_HELPERS + """
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then leave(ARGV[3], ARGV[2]) end
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
