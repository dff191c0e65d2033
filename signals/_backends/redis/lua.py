"""Lua scripts of :class:`~signals.RedisSignalStore`: one round trip per core call.

The same rules as the reference engine (``signals.kit._engine``), in Lua. Every inbox script
takes the same keys (:data:`KEY_NAMES`, all of one thread's hash tag, then the thread's
pending-index shard and the claimer's thread set) and starts its ``ARGV`` with the same
header: thread key, ``idx``, session prefix (``''`` when the store does not fuse with the
leases), stream cfg, retention ms, max receipts, idle TTL ms. ``idx`` is ``'1'`` on a
standalone Redis, where a script updates the cross-thread index itself, and ``'0'`` on a
Cluster, where the shard is another slot: the script then returns the index change
(``{op, score}``: ``'a'`` add at or before ``score``, ``'s'`` set, ``'r'`` remove, ``''`` none)
and the Python side applies it in a separate call.

Per thread: ``eb`` (entry number -> signal JSON), ``em`` (entry number -> its state as JSON:
``st`` state, ``h`` holder, ``n`` attempts, ``p`` priority, ``l`` lane, ``g`` merge, ``m``
mode, ``d`` due ms, ``nb`` not-before ms, ``x`` expiry ms, ``i`` signal id, ``e`` error),
``ix`` (signal id -> entry number), ``rq`` (ready entries, scored by priority then number),
``lt`` (entries not due yet, by due ms), ``xp`` (by expiry ms), ``hd`` (entries held or carried,
-> holder), ``ln`` (lane members, lexically ``<lane>\\0<number>``), ``lanes`` (lane -> its
state: last cache key ``c``, first pending ``f``, debounce gate ``g``), ``seen``/``receipts``
(the dedup record), ``dead``, ``meta`` (``seq``, ``paused``, ``token``, ``run``, ``since``,
``last``, ``abort``, ``tmax``) and ``stream``.

Every script is safe to replay (redis-py may resend a command after a timeout): a replayed
accept is a duplicate, a replayed ack finds nothing, a replayed take hands out the same run's
next entry (the first is still held by it and is given back when the run ends).
"""

from __future__ import annotations

from _signal_leases.lua import LEASE_FUNCTIONS

__all__ = [
    "ABORT", "ACCEPT", "CLAIM", "EMIT", "KEY_NAMES", "LOOK_AT", "PAUSE", "READ_STREAM",
    "RELEASE_IF_IDLE", "REVIVE", "SETTLE", "TAKE", "WITHDRAW",
]

#: The per-thread keys every inbox script takes, in order (then the shard and thread set).
KEY_NAMES = ("eb", "em", "ix", "rq", "lt", "xp", "hd", "seen", "receipts", "dead", "meta",
             "stream", "lanes", "ln", "lease", "fence")

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

# The shared library of the inbox scripts (see the module docstring).
_INBOX = LEASE_FUNCTIONS + _PARTS_FN + """
local K = {}
for i, name in ipairs({'eb', 'em', 'ix', 'rq', 'lt', 'xp', 'hd', 'seen', 'rc', 'dead', 'meta',
                       'stream', 'lanes', 'ln', 'lease', 'fence', 'shard', 'rt'}) do
  K[name] = KEYS[i]
end
local THREAD, IDX, SP, CFG = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local RETENTION, MAXR, IDLE = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = tonumber(t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
local ixop, ixscore = '', 0
local notices = {}

local function fmt(n) return string.format('%.0f', n) end
local function score(m, seq) return fmt((1000000 - m.p) * 4294967296 + seq) end
local function lkey(lane, seq) return lane .. '\\0' .. string.format('%012d', seq) end

local function get(seq)
  local raw = redis.call('HGET', K.em, seq)
  if not raw then return nil end
  return cjson.decode(raw)
end
local function put(seq, m) redis.call('HSET', K.em, seq, cjson.encode(m)) end

local function file(seq, m)
  if m.st == 'ready' then
    redis.call('ZADD', K.rq, score(m, tonumber(seq)), seq)
    redis.call('ZREM', K.lt, seq)
    redis.call('HDEL', K.hd, seq)
  elseif m.st == 'later' then
    redis.call('ZADD', K.lt, fmt(m.d), seq)
    redis.call('ZREM', K.rq, seq)
    redis.call('HDEL', K.hd, seq)
  else
    redis.call('ZREM', K.rq, seq)
    redis.call('ZREM', K.lt, seq)
    redis.call('HSET', K.hd, seq, m.h)
  end
  put(seq, m)
end

local function index(op, s)
  -- the thread's next look in the pending index ('a': at or before s, 's': set, 'r': remove)
  if IDX == '1' then
    if op == 'a' then redis.call('ZADD', K.shard, 'LT', fmt(s), THREAD)
    elseif op == 's' then redis.call('ZADD', K.shard, fmt(s), THREAD)
    elseif op == 'r' then redis.call('ZREM', K.shard, THREAD) end
  elseif op ~= '' then
    if op == 'a' and ixop == 'a' then s = math.min(s, ixscore) end
    ixop, ixscore = op, s
  end
end

local function set_receipt(sid, r)
  r.at = at
  redis.call('HSET', K.rc, sid, cjson.encode(r))
end

local function drop(seq, m)
  redis.call('HDEL', K.eb, seq)
  redis.call('HDEL', K.em, seq)
  redis.call('HDEL', K.ix, m.i)
  redis.call('ZREM', K.rq, seq)
  redis.call('ZREM', K.lt, seq)
  redis.call('ZREM', K.xp, seq)
  redis.call('HDEL', K.hd, seq)
  if m.l then redis.call('ZREM', K.ln, lkey(m.l, tonumber(seq))) end
end

local function remove_as(seq, m, status, run, by)
  drop(seq, m)
  local r = {status = status}
  if run and run ~= '' then r.run_id = run end
  if by then r.superseded_by = by end
  if m.e then r.error = m.e end
  set_receipt(m.i, r)
  local data = ''
  if by then data = cjson.encode({superseded_by = by}) end
  add_part(K.stream, K.meta, CFG, 'signal.' .. status, run or '', m.i, data)
  return m.i
end

local function lane_state(lane)
  local raw = redis.call('HGET', K.lanes, lane)
  if raw then return cjson.decode(raw) end
  return {}
end
local function save_lane(lane, s)
  if next(s) == nil then redis.call('HDEL', K.lanes, lane)
  else redis.call('HSET', K.lanes, lane, cjson.encode(s)) end
end

local function lane_members(lane)
  local out = {}
  for _, member in ipairs(redis.call('ZRANGEBYLEX', K.ln, '[' .. lane .. '\\0',
                                     '(' .. lane .. '\\1')) do
    local seq = tostring(tonumber(string.sub(member, #lane + 2)))
    local m = get(seq)
    if m then out[#out + 1] = {seq, m} end
  end
  return out
end

local function give_way(seqs)
  -- entries ready again (all of them first): one with a newer pending supersede signal in
  -- its lane (accepted while a run held it) is replaced by it now, as it would have then
  table.sort(seqs, function(a, b) return tonumber(a) < tonumber(b) end)
  for _, seq in ipairs(seqs) do
    local m = get(seq)
    if m and m.l and m.st == 'ready' then
      local members = redis.call('ZRANGEBYLEX', K.ln, '(' .. lkey(m.l, tonumber(seq)),
                                 '(' .. m.l .. '\\1')
      for _, member in ipairs(members) do
        local nm = get(tostring(tonumber(string.sub(member, #m.l + 2))))
        if nm and (nm.st == 'ready' or nm.st == 'later') and nm.g == 'supersede' then
          remove_as(seq, m, 'superseded', '', nm.i)
          break
        end
      end
    end
  end
end

local function lane_open(lane)
  -- whether the lane has an entry ready or later: members by seq, held ones first, so this
  -- stops after the few a run holds
  local from = '[' .. lane .. '\\0'
  while true do
    local page = redis.call('ZRANGEBYLEX', K.ln, from, '(' .. lane .. '\\1', 'LIMIT', 0, 16)
    for _, member in ipairs(page) do
      local m = get(tostring(tonumber(string.sub(member, #lane + 2))))
      if m and (m.st == 'ready' or m.st == 'later') then return true end
    end
    if #page < 16 then return false end
    from = '(' .. page[#page]
  end
end

local function emptied()
  if redis.call('HLEN', K.em) == 0 then
    index('r', 0)
    local all = redis.call('HGETALL', K.lanes)
    for i = 1, #all, 2 do
      local s = cjson.decode(all[i + 1])
      s.f = nil
      s.g = nil
      save_lane(all[i], s)
    end
  end
end

local function stale(run, token)
  local cur = tonumber(redis.call('HGET', K.meta, 'token') or '-1')
  if token ~= '' and tonumber(token) < cur then return true end
  if SP ~= '' then
    local live = lease_live(K.lease, SP)
    if live and live[1] ~= run then return true end
  end
  return false
end

local function adopt(run, token)
  local cur = redis.call('HGET', K.meta, 'run')
  if cur == run then return end
  local held = redis.call('HGETALL', K.hd)
  for i = 1, #held, 2 do
    if held[i + 1] ~= run then
      local m = get(held[i])
      if m then
        m.st, m.h = 'ready', nil
        file(held[i], m)
      end
    end
  end
  local function rt(r) return r and string.match(r, '^(.*)/[^/]*$') end
  if not cur or rt(cur) ~= rt(run) then redis.call('HSET', K.meta, 'since', at) end
  redis.call('HSET', K.meta, 'run', run)
  if token ~= '' then redis.call('HSET', K.meta, 'token', token) end
end

local function ripen()
  for _, seq in ipairs(redis.call('ZRANGEBYSCORE', K.lt, '-inf', now)) do
    local m = get(seq)
    if m then
      m.st, m.d = 'ready', nil
      file(seq, m)
    else
      redis.call('ZREM', K.lt, seq)
    end
  end
  for _, seq in ipairs(redis.call('ZRANGEBYSCORE', K.xp, '-inf', now)) do
    local m = get(seq)
    if m and m.st ~= 'held' then remove_as(seq, m, 'expired', '', nil)
    else redis.call('ZREM', K.xp, seq) end
  end
end

local function best(run)
  local top, tm = nil, nil
  local first = redis.call('ZRANGE', K.rq, 0, 0)
  if first[1] then
    top = first[1]
    tm = get(top)
  end
  local held = redis.call('HGETALL', K.hd)
  for i = 1, #held, 2 do
    if held[i + 1] == run then
      local m = get(held[i])
      if m and m.st == 'carried' and (not tm or m.p > tm.p
          or (m.p == tm.p and tonumber(held[i]) < tonumber(top))) then
        top, tm = held[i], m
      end
    end
  end
  return top, tm
end

local function has_work()
  return redis.call('ZCARD', K.rq) > 0 or redis.call('HLEN', K.hd) > 0
end

local function next_due()
  local first = redis.call('ZRANGE', K.lt, 0, 0, 'WITHSCORES')
  if first[1] then return tonumber(first[2]) end
  return nil
end

local function ack(run, eid, sid, result)
  local seq = redis.call('HGET', K.ix, sid)
  if not seq or seq ~= eid then return end
  local m = get(seq)
  drop(seq, m)
  local r = {status = 'processed', run_id = run}
  local data = ''
  if result ~= '' then
    r.result = cjson.decode(result)
    data = '{"result":' .. result .. '}'
  end
  set_receipt(sid, r)
  add_part(K.stream, K.meta, CFG, 'signal.acked', run, sid, data)
end

local function dead(seq, m, run)
  local body = redis.call('HGET', K.eb, seq) or ''
  drop(seq, m)
  local attempts = m.n - 1
  redis.call('HSET', K.dead, m.i, cjson.encode({s = body, m = m.m, n = attempts,
                                                e = m.e or '', at = at}))
  local r = {status = 'dead_lettered', run_id = run}
  if m.e then r.error = m.e end
  set_receipt(m.i, r)
  add_part(K.stream, K.meta, CFG, 'signal.dead_lettered', run, m.i,
           cjson.encode({attempts = attempts, error = m.e or cjson.null}))
end

local function touch()
  local keep = math.max(IDLE, RETENTION)
  for _, k in ipairs({K.eb, K.em, K.ix, K.rq, K.lt, K.xp, K.hd, K.seen, K.rc, K.meta,
                      K.lanes, K.ln}) do
    redis.call('PEXPIRE', k, keep)
  end
end

local function reply(...)
  local out = {...}
  out[#out + 1] = ixop
  out[#out + 1] = fmt(ixscore)
  return out
end
"""

#: ARGV after the header: 8 signal id, 9 signal JSON, 10 mode, 11 priority, 12 lane ('' none),
#: 13 merge, 14 cache key ('' none, 15 '1' when given), 16 not-before ms ('' none), 17 expiry ms,
#: 18 debounce ms, 19 max wait ms, 20 max pending ('' none), 21 overflow, 22 route '1' (fused:
#: claim or notify) or '0' (accept only: index), 23 claim owner ('' none), 24 claim ttl,
#: 25 claim session, 26 sender runtime, 27 notice prefix, 28 work channel, 29 wake workers,
#: 30 carry limit. Returns {outcome, entry, receipt JSON, reason, superseded, dropped, due ms,
#: owner, claimed, token, carried, ixop, ixscore}.
ACCEPT = _INBOX + """
local sid, body, mode, prio = ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[11])
local lane, merge = ARGV[12], ARGV[13]
if lane == '' then lane = nil end
local old = redis.call('ZRANGEBYSCORE', K.seen, '-inf', now - RETENTION, 'LIMIT', 0, 100)
for _, id in ipairs(old) do redis.call('HDEL', K.rc, id) end
if #old > 0 then redis.call('ZREM', K.seen, unpack(old)) end
local over = redis.call('ZCARD', K.seen) - MAXR
if over > 0 then
  local popped = redis.call('ZPOPMIN', K.seen, math.min(over, 100))
  for i = 1, #popped, 2 do redis.call('HDEL', K.rc, popped[i]) end
end
local owner = false
if ARGV[22] == '1' then
  local cur = lease_live(K.lease, SP)
  if cur then owner = cur[1] end
end
if redis.call('ZSCORE', K.seen, sid) then
  return reply('duplicate', false, redis.call('HGET', K.rc, sid) or false, false, {}, {}, false,
               owner, 0, false, 0)
end
local ls = {}
if lane then ls = lane_state(lane) end
if lane and ARGV[15] == '1' and ls.c == ARGV[14] then
  return reply('unchanged', false, false, false, {}, {}, false, owner, 0, false, 0)
end
local victims = {}
if lane and merge == 'supersede' then
  for _, pair in ipairs(lane_members(lane)) do
    if pair[2].st == 'ready' or pair[2].st == 'later' then victims[#victims + 1] = pair end
  end
end
local dropped = {}
if ARGV[20] ~= '' and redis.call('HLEN', K.em) - #victims >= tonumber(ARGV[20]) then
  local victim = nil
  if ARGV[21] == 'drop_oldest' then
    local cands = {}
    local last = redis.call('ZRANGE', K.rq, -1, -1)
    if last[1] then
      local lm = get(last[1])
      local lo = (1000000 - lm.p) * 4294967296
      local first = redis.call('ZRANGEBYSCORE', K.rq, fmt(lo), fmt(lo + 4294967295),
                               'LIMIT', 0, 1)
      if first[1] then cands[#cands + 1] = {first[1], get(first[1])} end
    end
    for _, seq in ipairs(redis.call('ZRANGE', K.lt, 0, -1)) do
      cands[#cands + 1] = {seq, get(seq)}
    end
    for _, c in ipairs(cands) do
      if c[2] and (not victim or c[2].p < victim[2].p
          or (c[2].p == victim[2].p and tonumber(c[1]) < tonumber(victim[1]))) then
        victim = c
      end
    end
    for _, v in ipairs(victims) do
      if victim and v[1] == victim[1] then victim = nil end
    end
  end
  if not victim then
    local reason = 'thread has ' .. redis.call('HLEN', K.em) ..
      ' pending signals, the most max_pending_per_thread=' .. ARGV[20] .. ' allows'
    return reply('rejected', false, false, reason, {}, {}, false, owner, 0, false, 0)
  end
  dropped[1] = remove_as(victim[1], victim[2], 'dropped', '', nil)
end
local superseded = {}
for _, pair in ipairs(victims) do
  superseded[#superseded + 1] = remove_as(pair[1], pair[2], 'superseded', '', sid)
end
local due = nil
if ARGV[16] ~= '' then due = tonumber(ARGV[16]) end
if lane then
  if ARGV[15] == '1' then ls.c = ARGV[14] else ls.c = nil end
  if ARGV[18] ~= '' then
    local first = ls.f or now
    local gate = now + tonumber(ARGV[18])
    if ARGV[19] ~= '' then gate = math.min(gate, first + tonumber(ARGV[19])) end
    ls.f, ls.g = first, gate
    for _, pair in ipairs(lane_members(lane)) do
      local m = pair[2]
      if m.st == 'ready' or m.st == 'later' then
        m.d = math.max(gate, m.nb or 0)
        if m.d > now then m.st = 'later' else m.st, m.d = 'ready', nil end
        file(pair[1], m)
      end
    end
    due = math.max(gate, due or 0)
  elseif not ls.f then
    ls.f = now
  end
  save_lane(lane, ls)
end
local later = due ~= nil and due > now
local seq = redis.call('HINCRBY', K.meta, 'seq', 1)
local m = {i = sid, m = mode, p = prio, g = merge, n = 0}
if lane then m.l = lane end
if ARGV[16] ~= '' then m.nb = tonumber(ARGV[16]) end
if ARGV[17] ~= '' then m.x = tonumber(ARGV[17]) end
if later then m.st, m.d = 'later', due else m.st = 'ready' end
redis.call('HSET', K.eb, seq, body)
redis.call('HSET', K.ix, sid, seq)
file(tostring(seq), m)
if m.x then redis.call('ZADD', K.xp, fmt(m.x), seq) end
if lane then redis.call('ZADD', K.ln, 0, lkey(lane, seq)) end
local status = 'pending'
if m.nb and m.nb > now then status = 'scheduled' end
redis.call('ZADD', K.seen, now, sid)
set_receipt(sid, {status = status})
redis.call('HSET', K.meta, 'last', at)
touch()
local due_out = false
if later then due_out = fmt(due) end
local paused = redis.call('HGET', K.meta, 'paused') == '1'
if ARGV[22] ~= '1' then
  if not paused then
    if later then index('a', due) else index('a', now) end
  end
  return reply('fresh', seq, status, false, superseded, dropped, due_out, false, 0, false, 0)
end
-- fused routing
if later then
  if not paused then index('a', due) end
  if ARGV[29] == '1' and not paused then
    redis.call('PUBLISH', ARGV[28], 'due\\n' .. THREAD .. '\\n\\n' .. (due / 1000))
  end
  return reply('fresh', seq, status, false, superseded, dropped, due_out, owner, 0, false, 0)
end
if owner then
  local rt = string.match(owner, '^(.*)/[^/]*$')
  local carried = ''
  if mode == 'deliver' and not paused and #body <= tonumber(ARGV[30]) then
    m.st, m.h, m.n = 'carried', owner, 1
    file(tostring(seq), m)
    add_part(K.stream, K.meta, CFG, 'signal.received', owner, sid, '{"attempt":1}')
    carried = '\\n\\n' .. seq .. ' ' .. body
  end
  if rt and rt ~= ARGV[26] then
    redis.call('PUBLISH', ARGV[27] .. rt, 'signal\\n' .. THREAD .. '\\n' .. owner .. carried)
  end
  local c = 0
  if carried ~= '' then c = 1 end
  return reply('fresh', seq, status, false, superseded, dropped, false, owner, 0, false, c)
end
if ARGV[23] ~= '' and not paused and session_alive(SP, ARGV[25]) then
  local token = lease_grant(K.lease, K.fence, ARGV[23], ARGV[24], ARGV[25])
  if IDX == '1' then redis.call('SADD', K.rt, THREAD) end
  redis.call('HSET', K.meta, 'since', at)
  return reply('fresh', seq, status, false, superseded, dropped, false, ARGV[23], 1, token, 0)
end
if not paused then
  index('a', now)
  if ARGV[29] == '1' then redis.call('PUBLISH', ARGV[28], 'work\\n' .. THREAD) end
end
return reply('fresh', seq, status, false, superseded, dropped, false, false, 0, false, 0)
"""

#: ARGV after the header: 8 run, 9 token ('' none), 10 max attempts, 11 first '1'/'0', then
#: per ack: entry, signal id, result JSON ('' none). Returns {status, entries, more, next due
#: ms, dead ids, ixop, ixscore}; status 'ok', 'fenced', 'paused' or 'stopped'; an entry is
#: {number, signal JSON, mode, attempts, state}.
TAKE = _INBOX + """
local run, token, maxn = ARGV[8], ARGV[9], tonumber(ARGV[10])
if stale(run, token) then return reply('fenced', {}, 0, false, {}) end
adopt(run, token)
for i = 12, #ARGV, 3 do ack(run, ARGV[i], ARGV[i + 1], ARGV[i + 2]) end
emptied()
if redis.call('HGET', K.meta, 'paused') == '1' then
  return reply('paused', {}, 0, false, {})
end
ripen()
local dead_ids, out, lanes_out = {}, {}, {}
while #out == 0 do
  local seq, m = best(run)
  if not seq then
    emptied()
    local nd = next_due()
    if nd then nd = fmt(nd) else nd = false end
    return reply('ok', {}, 0, nd, dead_ids)
  end
  if ARGV[11] ~= '1' and m.m == 'queue' and m.st == 'ready' then
    return reply('stopped', {}, 1, false, dead_ids)
  end
  local group = {{seq, m}}
  if m.l and m.g == 'coalesce' then
    group = {}
    for _, pair in ipairs(lane_members(m.l)) do
      local pm = pair[2]
      if pm.st == 'ready' or (pm.st == 'carried' and pm.h == run) then group[#group + 1] = pair end
    end
  end
  for _, pair in ipairs(group) do
    local s, pm = pair[1], pair[2]
    local carried = pm.st == 'carried' and pm.h == run
    if not carried then pm.n = pm.n + 1 end
    if pm.n > maxn then
      dead(s, pm, run)
      dead_ids[#dead_ids + 1] = pm.i
    else
      if not carried then
        add_part(K.stream, K.meta, CFG, 'signal.received', run, pm.i,
                 '{"attempt":' .. pm.n .. '}')
      end
      pm.st, pm.h = 'held', run
      file(s, pm)
      if pm.l then lanes_out[pm.l] = true end
      out[#out + 1] = {s, redis.call('HGET', K.eb, s), pm.m, pm.n, 'held'}
    end
  end
end
for lane, _ in pairs(lanes_out) do
  if not lane_open(lane) then
    local s = lane_state(lane)
    s.f, s.g = nil, nil
    save_lane(lane, s)
  end
end
emptied()
local more, nd = 0, false
if best(run) then more = 1 else
  nd = next_due()
  if nd then nd = fmt(nd) else nd = false end
end
return reply('ok', out, more, nd, dead_ids)
"""

#: ARGV after the header: 8 run, 9 token, 10 error ('' none), 11 #acks, 12 #failed, then
#: acks (entry, signal id, result), failed ids, returned ids. Returns {ok, ixop, ixscore}.
SETTLE = _INBOX + """
local run, token = ARGV[8], ARGV[9]
if stale(run, token) then return reply(0) end
local na, nf = tonumber(ARGV[11]), tonumber(ARGV[12])
local i = 13
local acks = {}
for _ = 1, na do
  acks[#acks + 1] = {ARGV[i], ARGV[i + 1], ARGV[i + 2]}
  i = i + 3
end
local failed = {}
for _ = 1, nf do
  failed[#failed + 1] = ARGV[i]
  i = i + 1
end
local backs = {}
for j = i, #ARGV do
  local seq = redis.call('HGET', K.ix, ARGV[j])
  local m = seq and get(seq)
  if m and (m.st == 'carried' or (m.st == 'held' and m.h == run)) then
    m.st, m.h, m.n = 'ready', nil, math.max(0, m.n - 1)
    file(seq, m)
    backs[#backs + 1] = seq
  end
end
adopt(run, token)
for _, a in ipairs(acks) do ack(run, a[1], a[2], a[3]) end
for _, sid in ipairs(failed) do
  local seq = redis.call('HGET', K.ix, sid)
  local m = seq and get(seq)
  if m and m.h == run then
    m.st, m.h = 'ready', nil
    if ARGV[10] ~= '' then m.e = ARGV[10] end
    file(seq, m)
    backs[#backs + 1] = seq
  end
end
give_way(backs)
emptied()
return reply(1)
"""

#: ARGV after the header: 8 held '1'/'0', 9 run id for the receipts ('' none), then signal ids
#: (none: every pending one). Returns {ids withdrawn, ixop, ixscore}.
WITHDRAW = _INBOX + """
local seqs = {}
if #ARGV < 10 then
  seqs = redis.call('HKEYS', K.em)
else
  for j = 10, #ARGV do
    local seq = redis.call('HGET', K.ix, ARGV[j])
    if seq then seqs[#seqs + 1] = seq end
  end
end
local removed = {}
for _, seq in ipairs(seqs) do
  local m = get(seq)
  if m and (ARGV[8] == '1' or m.st == 'ready' or m.st == 'later') then
    removed[#removed + 1] = remove_as(seq, m, 'cancelled', ARGV[9], nil)
  end
end
emptied()
return reply(removed)
"""

#: ARGV after the header: 8 at (ms). Returns {ixop, ixscore}.
LOOK_AT = _INBOX + """
if redis.call('HLEN', K.em) > 0 and redis.call('HGET', K.meta, 'paused') ~= '1' then
  index('s', tonumber(ARGV[8]))
else
  index('r', 0)
end
return reply()
"""

#: ARGV after the header: 8 '1' pause / '0' resume. Returns {was paused, ixop, ixscore}.
PAUSE = _INBOX + """
local was = redis.call('HGET', K.meta, 'paused') == '1'
if ARGV[8] == '1' then
  redis.call('HSET', K.meta, 'paused', '1')
  index('r', 0)
else
  redis.call('HDEL', K.meta, 'paused')
  if redis.call('HLEN', K.em) > 0 then index('a', now) end
end
touch()
if was then return reply(1) end
return reply(0)
"""

#: ARGV after the header: 8 purge '1'/'0', then signal ids (none: all). Returns {ids found,
#: ixop, ixscore}.
REVIVE = _INBOX + """
local ids = {}
if #ARGV < 9 then ids = redis.call('HKEYS', K.dead) else
  for j = 9, #ARGV do ids[#ids + 1] = ARGV[j] end
end
local found = {}
for _, sid in ipairs(ids) do
  local raw = redis.call('HGET', K.dead, sid)
  if raw then
    found[#found + 1] = sid
    redis.call('HDEL', K.dead, sid)
    if ARGV[8] ~= '1' then
      local d = cjson.decode(raw)
      local sig = cjson.decode(d.s)
      local seq = redis.call('HINCRBY', K.meta, 'seq', 1)
      local m = {i = sid, m = d.m or 'deliver', p = sig.priority or 0, g = sig.merge or 'append',
                 n = 0, st = 'ready'}
      if sig.lane then
        m.l = sig.lane
        redis.call('ZADD', K.ln, 0, lkey(sig.lane, seq))
      end
      redis.call('HSET', K.eb, seq, d.s)
      redis.call('HSET', K.ix, sid, seq)
      file(tostring(seq), m)
      set_receipt(sid, {status = 'pending'})
      index('a', now)
    end
  end
end
touch()
return reply(found)
"""

#: ARGV after the header: 8 owner, 9 ttl, 10 session, 11 notice prefix. Returns {code, owner,
#: token, left ms, ixop, ixscore}: code 1 claimed, 0 owned (deferred), 2 nothing ready.
CLAIM = _INBOX + """
if redis.call('HLEN', K.em) == 0 or redis.call('HGET', K.meta, 'paused') == '1' then
  index('r', 0)
  return reply(2, false, false, 0)
end
ripen()
local cur = lease_live(K.lease, SP)
if cur then
  local left = redis.call('PTTL', K.lease)
  if cur[3] then left = redis.call('PTTL', SP .. '{' .. cur[3] .. '}') end
  if left < 0 then left = tonumber(ARGV[9]) end
  index('s', now + left)
  if has_work() then
    local rt = string.match(cur[1], '^(.*)/[^/]*$')
    if rt then redis.call('PUBLISH', ARGV[11] .. rt, 'signal\\n' .. THREAD .. '\\n' .. cur[1]) end
  end
  return reply(0, cur[1], false, left)
end
if not has_work() then
  local nd = next_due()
  if nd then index('s', nd) else emptied() end
  return reply(2, false, false, nd and fmt(nd) or 0)
end
if not session_alive(SP, ARGV[10]) then return reply(3, false, false, 0) end
local token = lease_grant(K.lease, K.fence, ARGV[8], ARGV[9], ARGV[10])
redis.call('HSET', K.meta, 'since', at)
if IDX == '1' then redis.call('SADD', K.rt, THREAD) end
index('r', 0)
return reply(1, ARGV[8], token, 0)
"""

#: ARGV after the header: 8 owner. Returns {released, ixop, ixscore}: 1 when released (or not
#: held), 0 when ready work is left (the lease is kept).
RELEASE_IF_IDLE = _INBOX + """
local paused = redis.call('HGET', K.meta, 'paused') == '1'
ripen()
if not paused and has_work() then return reply(0) end
if redis.call('HGET', K.lease, 'owner') == ARGV[8] then redis.call('DEL', K.lease) end
if IDX == '1' then redis.call('SREM', K.rt, THREAD) end
local nd = next_due()
if paused or redis.call('HLEN', K.em) == 0 then index('r', 0)
elseif nd then index('s', nd) end
return reply(1)
"""

#: ARGV after the header: 8 run id ('' the current one), 9 reason, 10 clear '1'/'0', 11 notice
#: prefix. Marks the run aborted and notifies its runtime; with clear, withdraws every pending
#: signal. Returns {aborted run id or false, ixop, ixscore}.
ABORT = _INBOX + """
local run = ARGV[8]
if SP ~= '' then
  local cur = lease_live(K.lease, SP)
  if not cur or (run ~= '' and cur[1] ~= run) then return reply(false) end
  run = cur[1]
end
if run == '' then return reply(false) end
redis.call('HSET', K.meta, 'abort', run)
if ARGV[10] == '1' then
  for _, seq in ipairs(redis.call('HKEYS', K.em)) do
    local m = get(seq)
    if m then remove_as(seq, m, 'cancelled', run, nil) end
  end
  emptied()
end
local rt = string.match(run, '^(.*)/[^/]*$')
if rt then
  redis.call('PUBLISH', ARGV[11] .. rt, 'abort\\n' .. THREAD .. '\\n' .. run .. '\\n' .. ARGV[9])
end
return reply(run)
"""
