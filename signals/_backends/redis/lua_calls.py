"""The Lua scripts of the core calls of :class:`~signals.RedisSignalStore`, one round trip
each, over the shared functions of :mod:`signals._backends.redis.lua` (see its docstring for
the keys and the ``ARGV`` header every script takes)."""

from __future__ import annotations

from signals._backends.redis.lua import INBOX_FUNCTIONS

__all__ = ["ABORT", "ACCEPT", "CLAIM", "LOOK_AT", "PAUSE", "RELEASE_IF_IDLE", "REVIVE", "SETTLE",
           "TAKE", "WITHDRAW"]


#: ARGV after the header: 8 signal id, 9 signal JSON, 10 mode, 11 priority, 12 lane ('' none),
#: 13 merge, 14 cache key ('' none, 15 '1' when given), 16 not-before ms ('' none), 17 expiry ms,
#: 18 debounce ms, 19 max wait ms, 20 max pending ('' none), 21 overflow, 22 route '1' (fused:
#: claim or notify) or '0' (accept only: index), 23 claim owner ('' none), 24 claim ttl,
#: 25 claim session, 26 sender runtime, 27 notice prefix, 28 work channel, 29 wake workers,
#: 30 carry limit, 31 '1' for an interrupt (abort a live owner, carry nothing). Returns {outcome,
#: entry, receipt JSON, reason, superseded, dropped, due ms, owner, claimed, token, carried,
#: [workers that heard a work notice,] ixop, ixscore}.
ACCEPT = INBOX_FUNCTIONS + """
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
local waiting = redis.call('HGET', K.ix, sid)  -- pending, its receipt trimmed (max receipts)
if waiting then
  local st = cjson.decode(redis.call('HGET', K.em, waiting)).st == 'later' and 'scheduled'
  return reply('duplicate', false, cjson.encode({status = st or 'pending'}), false, {}, {},
               false, owner, 0, false, 0)
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
local paused = redis.call('HGET', K.meta, 'paused') == '1'
local carry = ARGV[22] == '1' and owner and not later and mode == 'deliver' and not paused
  and ARGV[31] ~= '1' and #body <= tonumber(ARGV[30])  -- to the live owner with its notice
if later then m.st, m.d = 'later', due elseif carry then m.st, m.h, m.n = 'carried', owner, 1
else m.st = 'ready' end
redis.call('HSET', K.eb, seq, body)
redis.call('HSET', K.ix, sid, seq)
file_new(tostring(seq), m)
if m.x then redis.call('ZADD', K.xp, fmt(m.x), seq) end
if lane then redis.call('ZADD', K.ln, 0, lkey(lane, seq)) end
local status = 'pending'
if m.nb and m.nb > now then status = 'scheduled' end
redis.call('ZADD', K.seen, now, sid)
set_receipt(sid, {status = status})
redis.call('HSET', K.meta, 'last', at)
touch()
local due_out = later and fmt(due) or false
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
if owner and ARGV[31] == '1' then  -- interrupt: the owner stops; the next run takes this one
  abort_run(owner, ARGV[27], 'interrupt')
  return reply('fresh', seq, status, false, superseded, dropped, false, owner, 0, false, 0)
end
if owner then
  local rt = string.match(owner, '^(.*)/[^/]*$')
  local carried = ''
  if carry then
    add_part(K.stream, K.meta, CFG, 'signal.received', owner, sid, '{"attempt":1}')
    carried = '\\n\\n' .. seq .. ' ' .. body
  end
  if rt and rt ~= ARGV[26] then
    redis.call('PUBLISH', ARGV[27] .. rt, 'signal\\n' .. THREAD .. '\\n' .. owner .. carried)
  end
  local c = carried ~= '' and 1 or 0
  return reply('fresh', seq, status, false, superseded, dropped, false, owner, 0, false, c)
end
if ARGV[23] ~= '' and not paused and session_alive(SP, ARGV[25]) then
  local token = lease_grant(K.lease, K.fence, ARGV[23], ARGV[24], ARGV[25])
  if IDX == '1' then redis.call('SADD', K.rt, THREAD) end
  redis.call('HSET', K.meta, 'since', at)
  return reply('fresh', seq, status, false, superseded, dropped, false, ARGV[23], 1, token, 0)
end
local heard = false  -- the workers that heard the work notice (on this node, on a Cluster)
if not paused then
  index('a', now)
  if ARGV[29] == '1' then heard = redis.call('PUBLISH', ARGV[28], 'work\\n' .. THREAD) end
end
return reply('fresh', seq, status, false, superseded, dropped, false, false, 0, false, 0, heard)
"""

#: ARGV after the header: 8 run, 9 token ('' none), 10 max attempts, 11 first '1'/'0', then
#: per ack: entry, signal id, result JSON ('' none). Returns {status, entries, more, next due
#: ms, dead ids, ixop, ixscore}; status 'ok', 'fenced', 'paused' or 'stopped'; an entry is
#: {number, signal JSON, mode, attempts, state}.
TAKE = INBOX_FUNCTIONS + """
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
    return reply('ok', {}, 0, nd, dead_ids, redis.call('HLEN', K.em))
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
return reply('ok', out, more, nd, dead_ids, redis.call('HLEN', K.em))
"""

#: ARGV after the header: 8 run, 9 token, 10 error ('' none), 11 #acks, 12 #failed, then
#: acks (entry, signal id, result), failed ids, returned ids. Returns {ok, ixop, ixscore}.
SETTLE = INBOX_FUNCTIONS + """
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
WITHDRAW = INBOX_FUNCTIONS + """
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
LOOK_AT = INBOX_FUNCTIONS + """
if redis.call('HLEN', K.em) > 0 and redis.call('HGET', K.meta, 'paused') ~= '1' then
  index('s', tonumber(ARGV[8]))
else
  index('r', 0)
end
return reply()
"""

#: ARGV after the header: 8 '1' pause / '0' resume. Returns {was paused, ixop, ixscore}.
PAUSE = INBOX_FUNCTIONS + """
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
REVIVE = INBOX_FUNCTIONS + """
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
CLAIM = INBOX_FUNCTIONS + """
if redis.call('HLEN', K.em) == 0 or redis.call('HGET', K.meta, 'paused') == '1' then
  index('r', 0)
  return reply(2, false, false, 0)
end
ripen()
local cur, dead = lease_live(K.lease, SP)
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
local token = lease_grant(K.lease, K.fence, ARGV[8], ARGV[9], ARGV[10], not dead)
redis.call('HSET', K.meta, 'since', at)
if IDX == '1' then redis.call('SADD', K.rt, THREAD) end
index('r', 0)
return reply(1, ARGV[8], token, 0)
"""

#: ARGV after the header: 8 owner. Returns {released, ixop, ixscore}: 1 when released (or not
#: held), 0 when ready work is left (the lease is kept).
RELEASE_IF_IDLE = INBOX_FUNCTIONS + """
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
#: prefix. Aborts the run (``abort_run``); with clear, withdraws every pending signal first.
#: Returns {aborted run id or false, ixop, ixscore}.
ABORT = INBOX_FUNCTIONS + """
local run = ARGV[8]
if SP ~= '' then
  local cur = lease_live(K.lease, SP)
  if not cur or (run ~= '' and cur[1] ~= run) then return reply(false) end
  run = cur[1]
end
if run == '' then return reply(false) end
if ARGV[10] == '1' then
  for _, seq in ipairs(redis.call('HKEYS', K.em)) do
    local m = get(seq)
    if m then remove_as(seq, m, 'cancelled', run, nil) end
  end
  emptied()
end
abort_run(run, ARGV[11], ARGV[9])
return reply(run)
"""
