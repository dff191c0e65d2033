"""Lua scripts of :class:`~signals.RedisSignalStore`: one round trip per store call.

Per-thread keys share the thread's hash tag (see ``_signal_leases.keys``). Scripts that also
touch a cross-thread index (a pending-index shard, a runtime's thread set) take the flag
``idx``: ``'1'`` on a standalone Redis, where one script may touch any key; ``'0'`` on a
Cluster, where the Python side updates the index in a separate call, in a crash-safe order.

Inbox entries have fields ``s`` (the signal JSON), ``m`` (mode) and ``i`` (signal id). The
attempts hash holds ``<entry id>`` -> deliveries, ``<entry id>@`` -> the run it was last
handed to, and ``e:<signal id>`` -> the last error a run reported for it. Receipts are JSON.

Every script is safe to replay (redis-py may resend a command after a timeout).
"""

from __future__ import annotations

from _signal_leases.lua import LEASE_FUNCTIONS

__all__ = [
    "ABORT", "ACK", "CANCEL", "CLAIM_PENDING", "DELIVER", "EMIT", "READ", "READ_STREAM",
    "RELEASE_IF_IDLE", "ROUTE", "UNDELIVER",
]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
"""

# add_part(stream, meta, cfg, kind, run, sid, data): append one part to a thread's output
# stream (fields k, r, s, d, t) and trim it exactly to ``cfg`` = "<max parts>:<retention ms>",
# remembering in meta.tmax the newest id ever trimmed (a cursor below it has lost parts).
# ``cfg`` ending in ":1" (a Cluster) also announces the new id on the sharded pub/sub channel
# named like the stream (same slot), which the Cluster's stream follower subscribes to.
_PARTS_FN = """
local function trim_to(stream, meta, minid, count)
  local gone = redis.call('XRANGE', stream, '-', minid, 'COUNT', count)
  if #gone == 0 then return end
  local last = gone[#gone][1]
  redis.call('XTRIM', stream, 'MINID', '=', last)
  redis.call('XDEL', stream, last)
  redis.call('HSET', meta, 'tmax', last)
end
local function add_part(stream, meta, cfg, kind, run, sid, data)
  local maxlen, retention, shard = string.match(cfg, '^(%d+):(%d+):?(%d*)$')
  local t = redis.call('TIME')
  local id = redis.call('XADD', stream, '*', 'k', kind, 'r', run, 's', sid, 'd', data,
                        't', t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
  local over = redis.call('XLEN', stream) - tonumber(maxlen)
  if over > 0 then trim_to(stream, meta, '+', over) end
  local horizon = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(retention)
  trim_to(stream, meta, '(' .. horizon .. '-0', 100)
  redis.call('PEXPIRE', stream, retention)
  redis.call('PEXPIRE', meta, retention)
  if shard == '1' then redis.call('SPUBLISH', stream, id) end
  return id
end
"""

#: KEYS: stream, meta. ARGV: 1 "<max parts>:<retention ms>", then per part: kind, run id,
#: signal id, data JSON ('' for none). Returns the new cursors.
EMIT = _PARTS_FN + """
local ids = {}
for i = 2, #ARGV, 4 do
  ids[#ids + 1] = add_part(KEYS[1], KEYS[2], ARGV[1], ARGV[i], ARGV[i + 1], ARGV[i + 2],
                           ARGV[i + 3])
end
return ids
"""

#: KEYS: stream, meta. ARGV: after ('' from the start), count. Returns {tmax or '', rows}.
READ_STREAM = """
local start = '-'
if ARGV[1] ~= '' then start = '(' .. ARGV[1] end
return {redis.call('HGET', KEYS[2], 'tmax') or '',
        redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[2])}
"""

#: KEYS: inbox, seen, receipts, lease, fence, pending shard, claimer's thread set, attempts,
#: meta, stream. ARGV: 1 session prefix, 2 thread, 3 signal id, 4 signal JSON, 5 mode,
#: 6 retention ms, 7 max receipts, 8 idle ttl ms, 9 claim owner ('' none), 10 claim ttl,
#: 11 claim session, 12 sender runtime id, 13 notice channel prefix, 14 work channel,
#: 15 wake workers '1'/'0', 16 idx, 17 index only '1'/'0' (accept without routing: always
#: index the thread), 18 stream cfg, 19 carry limit (bytes): a ``deliver`` signal for a live
#: owner, no larger than this, is delivered to the owner's run in the same step and carried in
#: the notice, so the run hands it out without reading the inbox.
#: Returns {fresh, entry id, original receipt (duplicates), owner, claimed, token, carried}.
ROUTE = LEASE_FUNCTIONS + _NOW + _PARTS_FN + """
local retention = tonumber(ARGV[6])
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - retention, 'LIMIT', 0, 100)
for _, id in ipairs(old) do redis.call('HDEL', KEYS[3], id) end
if #old > 0 then redis.call('ZREM', KEYS[2], unpack(old)) end
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[7])
if over > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], math.min(over, 100))
  for i = 1, #popped, 2 do redis.call('HDEL', KEYS[3], popped[i]) end
end
local owner = false
if ARGV[17] ~= '1' then
  local cur = lease_live(KEYS[4], ARGV[1])
  if cur then owner = cur[1] end
end
if redis.call('ZSCORE', KEYS[2], ARGV[3]) then
  return {0, false, redis.call('HGET', KEYS[3], ARGV[3]) or false, owner, 0, false}
end
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('HSET', KEYS[3], ARGV[3], '{"status":"pending","at":' .. at .. '}')
local id = redis.call('XADD', KEYS[1], '*', 's', ARGV[4], 'm', ARGV[5], 'i', ARGV[3])
redis.call('HSET', KEYS[8], 'x:' .. ARGV[3], id)
redis.call('HSET', KEYS[9], 'last', at)
local keep = math.max(tonumber(ARGV[8]), retention)
for _, i in ipairs({1, 2, 3, 8, 9}) do redis.call('PEXPIRE', KEYS[i], keep) end
if ARGV[17] == '1' then
  if ARGV[16] == '1' then redis.call('ZADD', KEYS[6], 'NX', now, ARGV[2]) end
  return {1, id, false, false, 0, false}
end
if owner then
  local rt = string.match(owner, '^(.*)/[^/]*$')
  local carried = ''
  if ARGV[5] == 'deliver' and #ARGV[4] <= tonumber(ARGV[19]) then
    redis.call('HSET', KEYS[8], id, 1, id .. '@', owner)
    add_part(KEYS[10], KEYS[9], ARGV[18], 'signal.received', owner, ARGV[3], '{"attempt":1}')
    carried = '\\n\\n' .. id .. ' ' .. ARGV[4]
  end
  if rt and rt ~= ARGV[12] then
    redis.call('PUBLISH', ARGV[13] .. rt, 'signal\\n' .. ARGV[2] .. '\\n' .. owner .. carried)
  end
  return {1, id, false, owner, 0, false, carried ~= '' and 1 or 0}
end
if ARGV[9] ~= '' and session_alive(ARGV[1], ARGV[11]) then
  local token = lease_grant(KEYS[4], KEYS[5], ARGV[9], ARGV[10], ARGV[11])
  if ARGV[16] == '1' then redis.call('SADD', KEYS[7], ARGV[2]) end
  redis.call('HSET', KEYS[9], 'since', at)
  return {1, id, false, ARGV[9], 1, token}
end
if ARGV[16] == '1' then redis.call('ZADD', KEYS[6], 'NX', now, ARGV[2]) end
if ARGV[15] == '1' then redis.call('PUBLISH', ARGV[14], 'work\\n' .. ARGV[2]) end
return {1, id, false, false, 0, false}
"""

# Fencing: with a session prefix given (not ''), refuse when another run holds the lease.
# deliver_entry(K, id, fields, run, max, thread, idx, sp, cfg), K = {inbox, attempts,
# receipts, dead, shard, lease, stream, meta}: count one hand-out to ``run`` (and write a
# ``signal.received`` part); returns the attempt, -1 when the entry went to the dead letters
# instead (``signal.dead_lettered``), -2 when another run holds the lease.
_DELIVER_FN = LEASE_FUNCTIONS + _NOW + _PARTS_FN + """
local function other_owner(lease, sp, run)
  if sp == '' then return false end
  local cur = lease_live(lease, sp)
  return cur ~= nil and cur[1] ~= run
end
local function field(f, name)
  for i = 1, #f, 2 do if f[i] == name then return f[i + 1] end end
  return ''
end
local function deliver_entry(K, id, f, run, max, thread, idx, sp, cfg)
  if other_owner(K[6], sp, run) then return -2 end
  local n = tonumber(redis.call('HGET', K[2], id) or '0')
  local sid = field(f, 'i')
  if redis.call('HGET', K[2], id .. '@') ~= run then
    n = n + 1
    redis.call('HSET', K[2], id, n, id .. '@', run)
    if n <= tonumber(max) then
      add_part(K[7], K[8], cfg, 'signal.received', run, sid, '{"attempt":' .. n .. '}')
    end
  end
  if n <= tonumber(max) then return n end
  local s, m = field(f, 's'), field(f, 'm')
  if m == '' then m = 'deliver' end
  local err = redis.call('HGET', K[2], 'e:' .. sid)
  redis.call('HSET', K[4], sid, cjson.encode({s = s, m = m, n = n - 1, e = err or '', at = at}))
  redis.call('XDEL', K[1], id)
  redis.call('HDEL', K[2], id, id .. '@', 'e:' .. sid, 'x:' .. sid)
  local r = {status = 'dead_lettered', run_id = run, at = tonumber(at)}
  if err then r.error = err end
  redis.call('HSET', K[3], sid, cjson.encode(r))
  add_part(K[7], K[8], cfg, 'signal.dead_lettered', run, sid,
           cjson.encode({attempts = n - 1, error = err or cjson.null}))
  if idx == '1' and redis.call('XLEN', K[1]) == 0 then redis.call('ZREM', K[5], thread) end
  return -1
end
"""

#: KEYS: inbox, attempts, receipts, dead, pending shard, lease, stream, meta.
#: ARGV: 1 start ('-' or '(<id>'), 2 count, 3 max bytes, 4 run to deliver the first entry to
#: ('' none), 5 max attempts, 6 thread, 7 idx, 8 session prefix ('' unfenced), 9 '1' to
#: leave a first entry of mode ``queue`` undelivered (the run stops before it), 10 stream cfg.
#: Returns {more, {id, fields, attempts, delivered}, ...}: at most ``count`` entries and,
#: past the first, at most ``max bytes`` of field values; ``delivered`` is the first entry's
#: ``deliver_entry`` result when a run was given, else 0; ``more`` is 1 when the read stopped
#: before the end of the inbox.
READ = _DELIVER_FN + """
local count = tonumber(ARGV[2])
local out, total, limit = {0}, 0, tonumber(ARGV[3])
-- Pages that start small and double: a backlog of large entries is never copied whole into
-- the script (XRANGE has no byte bound), a backlog of small ones costs a few calls.
local start, i, page = ARGV[1], 0, 2
while true do
  page = math.min(page * 2, count + 1 - i)
  local rows = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', page)
  for _, row in ipairs(rows) do
    i = i + 1
    local size = 0
    for j = 2, #row[2], 2 do size = size + #row[2][j] end
    if i > count or (i > 1 and total + size > limit) then
      out[1] = 1
      return out
    end
    total = total + size
    local delivered = 0
    local queued = false
    if ARGV[9] == '1' then
      for j = 1, #row[2], 2 do
        if row[2][j] == 'm' and row[2][j + 1] == 'queue' then queued = true end
      end
    end
    if i == 1 and ARGV[4] ~= '' and not queued then
      delivered = deliver_entry(KEYS, row[1], row[2], ARGV[4], ARGV[5], ARGV[6], ARGV[7],
                                ARGV[8], ARGV[10])
      if delivered == -2 then return {1, {row[1], row[2], '0', -2}} end
    end
    out[#out + 1] = {row[1], row[2], redis.call('HGET', KEYS[2], row[1]) or '0', delivered}
  end
  if #rows < page then return out end
  start = '(' .. rows[#rows][1]
end
"""

#: KEYS: inbox, attempts, receipts, dead, pending shard, lease, stream, meta.
#: ARGV: 1 entry id, 2 run id, 3 max attempts, 4 thread, 5 idx, 6 session prefix, 7 stream cfg.
#: Returns the attempt number, 0 when the entry is gone, -1 when it was dead-lettered, -2
#: when another run holds the lease.
DELIVER = _DELIVER_FN + """
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return 0 end
return deliver_entry(KEYS, ARGV[1], e[1][2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
                     ARGV[7])
"""

#: KEYS: inbox, attempts, receipts, dead, pending shard, lease, stream, meta. ARGV: 1 thread,
#: 2 idx, 3 session prefix ('' unfenced), 4 run id, 5 stream cfg, 6 entry to deliver next to
#: the same run ('' none), 7 max attempts, then per ack: entry id, signal id, result JSON ('' none).
#: Returns {1, delivered, empty} (``delivered``: ``deliver_entry``'s result for the next entry,
#: 0 when none or gone; ``empty``: 1 when the inbox is now empty), or {0, 0} (nothing changed)
#: when another run holds the lease. Each
#: acknowledgement also writes a ``signal.acked`` part (data: the result).
ACK = _DELIVER_FN + """
if other_owner(KEYS[6], ARGV[3], ARGV[4]) then return {0, 0} end
for i = 8, #ARGV, 3 do
  local eid, sid = ARGV[i], ARGV[i + 1]
  if redis.call('XDEL', KEYS[1], eid) == 1 then
    redis.call('HDEL', KEYS[2], eid, eid .. '@', 'e:' .. sid, 'x:' .. sid)
    local r = '{"status":"processed","run_id":' .. cjson.encode(ARGV[4]) .. ',"at":' .. at
    local data = ''
    if ARGV[i + 2] ~= '' then
      r = r .. ',"result":' .. ARGV[i + 2]
      data = '{"result":' .. ARGV[i + 2] .. '}'
    end
    redis.call('HSET', KEYS[3], sid, r .. '}')
    add_part(KEYS[7], KEYS[8], ARGV[5], 'signal.acked', ARGV[4], sid, data)
  end
end
local delivered = 0
if ARGV[6] ~= '' then
  local e = redis.call('XRANGE', KEYS[1], ARGV[6], ARGV[6])
  if #e > 0 then
    delivered = deliver_entry(KEYS, ARGV[6], e[1][2], ARGV[4], ARGV[7], ARGV[1], ARGV[2],
                              ARGV[3], ARGV[5])
  end
end
local empty = redis.call('XLEN', KEYS[1]) == 0 and 1 or 0
if ARGV[2] == '1' and empty == 1 then redis.call('ZREM', KEYS[5], ARGV[1]) end
return {1, delivered, empty}
"""

#: KEYS: lease, inbox, owner's thread set. ARGV: owner, thread, idx. 1 when released (or
#: already not held), 0 when the inbox still has entries (the lease is kept).
RELEASE_IF_IDLE = """
if redis.call('XLEN', KEYS[2]) > 0 then return 0 end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[3] == '1' then redis.call('SREM', KEYS[3], ARGV[2]) end
return 1
"""

#: KEYS: lease, fence, inbox, pending shard, claimer's thread set, meta.
#: ARGV: 1 session prefix, 2 thread, 3 owner, 4 ttl, 5 session, 6 idx.
#: Returns {1, owner, token} claimed, {0, holder, false, ms} owned (the thread stays indexed,
#: scored ``ms`` from now: when the holder's lease expires unless renewed), {2} empty,
#: {3} session gone.
CLAIM_PENDING = LEASE_FUNCTIONS + _NOW + """
if redis.call('XLEN', KEYS[3]) == 0 then
  if ARGV[6] == '1' then redis.call('ZREM', KEYS[4], ARGV[2]) end
  return {2, false, false}
end
local cur = lease_live(KEYS[1], ARGV[1])
if cur then
  local left = redis.call('PTTL', KEYS[1])
  if cur[3] then left = redis.call('PTTL', ARGV[1] .. '{' .. cur[3] .. '}') end
  if left < 0 then left = tonumber(ARGV[4]) end
  if ARGV[6] == '1' then redis.call('ZADD', KEYS[4], now + left, ARGV[2]) end
  return {0, cur[1], false, left}
end
if not session_alive(ARGV[1], ARGV[5]) then return {3, false, false} end
local token = lease_grant(KEYS[1], KEYS[2], ARGV[3], ARGV[4], ARGV[5])
redis.call('HSET', KEYS[6], 'since', at)
if ARGV[6] == '1' then
  redis.call('SADD', KEYS[5], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
return {1, ARGV[3], token}
"""

# remove_entry(K, id, sid, run, cfg): withdraw one pending entry (receipt ``cancelled``, part
# ``signal.cancelled``). K = {inbox, attempts, receipts, stream, meta}.
_CANCEL_FN = _PARTS_FN + _NOW + """
local function remove_entry(K, id, sid, run, cfg)
  redis.call('XDEL', K[1], id)
  redis.call('HDEL', K[2], id, id .. '@', 'e:' .. sid, 'x:' .. sid)
  local r = {status = 'cancelled', at = tonumber(at)}
  if run ~= '' then r.run_id = run end
  redis.call('HSET', K[3], sid, cjson.encode(r))
  add_part(K[4], K[5], cfg, 'signal.cancelled', run, sid, '')
end
"""

#: KEYS: lease, inbox, attempts, receipts, stream, meta, pending shard. ARGV: 1 session prefix
#: ('': trust 2), 2 run id ('' the current one), 3 reason, 4 clear '1'/'0', 5 notice prefix,
#: 6 thread, 7 idx, 8 stream cfg. Marks the run aborted and notifies its runtime; with clear,
#: withdraws every pending signal. Returns the aborted run id, or false (no such active run).
ABORT = LEASE_FUNCTIONS + _CANCEL_FN + """
local run = ARGV[2]
if ARGV[1] ~= '' then
  local cur = lease_live(KEYS[1], ARGV[1])
  if not cur or (run ~= '' and cur[1] ~= run) then return false end
  run = cur[1]
end
if run == '' then return false end
redis.call('HSET', KEYS[6], 'abort', run)
if ARGV[4] == '1' then
  local K = {KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
  for _, row in ipairs(redis.call('XRANGE', KEYS[2], '-', '+')) do
    local sid = ''
    for i = 1, #row[2], 2 do if row[2][i] == 'i' then sid = row[2][i + 1] end end
    remove_entry(K, row[1], sid, run, ARGV[8])
  end
  if ARGV[7] == '1' then redis.call('ZREM', KEYS[7], ARGV[6]) end
end
local rt = string.match(run, '^(.*)/[^/]*$')
if rt then
  redis.call('PUBLISH', ARGV[5] .. rt, 'abort\\n' .. ARGV[6] .. '\\n' .. run .. '\\n' .. ARGV[3])
end
return run
"""

#: KEYS: lease, inbox, attempts, receipts, stream, meta, pending shard. ARGV: 1 session
#: prefix ('': trust 2), 2 the run whose hand-outs stay, 3 thread, 4 idx, 5 stream cfg, then
#: signal ids. Withdraws each pending signal no live run holds; returns the ids withdrawn.
CANCEL = LEASE_FUNCTIONS + _CANCEL_FN + """
local owner = ARGV[2]
if ARGV[1] ~= '' then
  local cur = lease_live(KEYS[1], ARGV[1])
  owner = cur and cur[1] or ''
end
local K = {KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
local removed = {}
for i = 6, #ARGV do
  local sid = ARGV[i]
  local id = redis.call('HGET', KEYS[3], 'x:' .. sid)
  if id and #redis.call('XRANGE', KEYS[2], id, id) > 0 then
    local holder = redis.call('HGET', KEYS[3], id .. '@')
    if owner == '' or holder ~= owner then
      remove_entry(K, id, sid, '', ARGV[5])
      removed[#removed + 1] = sid
    end
  end
end
if ARGV[4] == '1' and redis.call('XLEN', KEYS[2]) == 0 then redis.call('ZREM', KEYS[7], ARGV[3]) end
return removed
"""

#: KEYS: attempts. ARGV: 1 run id, then entry ids. Takes back the hand-out counted for each
#: entry last delivered to the run (read ahead, never handed to its agent).
UNDELIVER = """
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[1], id .. '@') == ARGV[1] then
    if tonumber(redis.call('HGET', KEYS[1], id) or '0') > 0 then
      redis.call('HINCRBY', KEYS[1], id, -1)
    end
    redis.call('HDEL', KEYS[1], id .. '@')
  end
end
return 1
"""
