"""Lua scripts of :class:`~signals.RedisSignalStore`: one round trip per core call.

The same rules as the reference engine (``signals.kit._rules``), in Lua. Every inbox script
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

This module holds the shared functions (:data:`INBOX_FUNCTIONS`) and the stream scripts; the
core calls' scripts are in :mod:`signals._backends.redis.lua_calls`.

Every script is safe to replay (redis-py may resend a command after a timeout): a replayed
accept is a duplicate, a replayed ack finds nothing, a replayed take hands out the same run's
next entry (the first is still held by it and is given back when the run ends).
"""

from __future__ import annotations

from _signal_leases.lua import LEASE_FUNCTIONS

__all__ = ["ANNOUNCE_BYTES", "EMIT", "INBOX_FUNCTIONS", "KEY_NAMES", "READ_STREAM"]

#: A part announced with its content up to this size (its kind and data), else by its id.
ANNOUNCE_BYTES = 4096

#: The per-thread keys every inbox script takes, in order (then the shard and thread set).
KEY_NAMES = ("eb", "em", "ix", "rq", "lt", "xp", "hd", "seen", "receipts", "dead", "meta",
             "stream", "lanes", "ln", "lease", "fence")

# add_part(stream, meta, cfg, kind, run, sid, data): append one part to a thread's output
# stream (fields k, r, s, d, t) and trim it exactly to ``cfg`` = "<max parts>:<retention ms>",
# remembering in meta.tmax the newest id ever trimmed (a cursor below it has lost parts).
# Each part is announced on the pub/sub channel named like the stream, which the follower of
# a process subscribes to while somebody there waits on the stream: ``cfg`` ending in ":1" (a
# Cluster) with ``SPUBLISH`` (sharded: same slot as the stream), in ":2" with ``PUBLISH``. The
# announcement carries the part itself (a JSON array: id, kind, run, signal id, time, data), or
# only its id when the part is larger than ANNOUNCE_BYTES (the follower then reads it).
_PARTS_FN = """
local ANNOUNCE_BYTES = @ANNOUNCE_BYTES@
local function trim_to(stream, meta, minid, count)
  local gone = redis.call('XRANGE', stream, '-', minid, 'COUNT', count)
  if #gone == 0 then return end
  local last = gone[#gone][1]
  redis.call('XTRIM', stream, 'MINID', '=', last)
  redis.call('XDEL', stream, last)
  redis.call('HSET', meta, 'tmax', last)
end
local PART_TIME = nil  -- the inbox scripts' own TIME, read once per script
local function add_part(stream, meta, cfg, kind, run, sid, data)
  local maxlen, retention, shard = string.match(cfg, '^(%d+):(%d+):?(%d*)$')
  local t = PART_TIME or redis.call('TIME')
  local at = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  local id = redis.call('XADD', stream, '*', 'k', kind, 'r', run, 's', sid, 'd', data, 't', at)
  local over = redis.call('XLEN', stream) - tonumber(maxlen)
  if over > 0 then trim_to(stream, meta, '+', over) end
  local horizon = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(retention)
  trim_to(stream, meta, '(' .. horizon .. '-0', 100)
  redis.call('PEXPIRE', stream, retention)
  -- meta (tmax) lives at least as long as the stream, and is never cut short: it is also
  -- the thread's record (entry counter, pause, token), kept for the thread's idle TTL
  if redis.call('PTTL', meta) < tonumber(retention) then
    redis.call('PEXPIRE', meta, retention)
  end
  if shard ~= '' then
    local note = id
    if #data + #kind <= ANNOUNCE_BYTES then
      note = cjson.encode({id, kind, run, sid, at, data})
    end
    redis.call(shard == '1' and 'SPUBLISH' or 'PUBLISH', stream, note)
  end
  return id
end
""".replace("@ANNOUNCE_BYTES@", str(ANNOUNCE_BYTES))

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
INBOX_FUNCTIONS = LEASE_FUNCTIONS + _PARTS_FN + """
local K = {eb = KEYS[1], em = KEYS[2], ix = KEYS[3], rq = KEYS[4], lt = KEYS[5], xp = KEYS[6],
           hd = KEYS[7], seen = KEYS[8], rc = KEYS[9], dead = KEYS[10], meta = KEYS[11],
           stream = KEYS[12], lanes = KEYS[13], ln = KEYS[14], lease = KEYS[15],
           fence = KEYS[16], shard = KEYS[17], rt = KEYS[18]}  -- (KEY_NAMES, then two)
local THREAD, IDX, SP, CFG = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local RETENTION, MAXR, IDLE = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
PART_TIME = t
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

local function file_new(seq, m)
  -- into the one set its state names (ready: rq, later: lt, held or carried: hd), and its
  -- state; a new entry number (from the thread's counter) is in no set yet: only this
  if m.st == 'ready' then redis.call('ZADD', K.rq, score(m, tonumber(seq)), seq)
  elseif m.st == 'later' then redis.call('ZADD', K.lt, fmt(m.d), seq)
  else redis.call('HSET', K.hd, seq, m.h) end
  put(seq, m)
end

local function file(seq, m)
  -- out of the two sets its state does not name (its last state is not known here)
  if m.st ~= 'ready' then redis.call('ZREM', K.rq, seq) end
  if m.st ~= 'later' then redis.call('ZREM', K.lt, seq) end
  if m.st == 'ready' or m.st == 'later' then redis.call('HDEL', K.hd, seq) end
  file_new(seq, m)
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
  -- an entry is in the one set its state names (file keeps it so), in xp only with an
  -- expiry and in ln only with a lane
  redis.call('HDEL', K.eb, seq)
  redis.call('HDEL', K.em, seq)
  redis.call('HDEL', K.ix, m.i)
  if m.st == 'ready' then redis.call('ZREM', K.rq, seq)
  elseif m.st == 'later' then redis.call('ZREM', K.lt, seq)
  else redis.call('HDEL', K.hd, seq) end
  if m.x then redis.call('ZREM', K.xp, seq) end
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

local function abort_run(run, prefix, reason)  -- marked, and its runtime told
  redis.call('HSET', K.meta, 'abort', run)
  local rt = string.match(run, '^(.*)/[^/]*$')
  if rt then
    redis.call('PUBLISH', prefix .. rt, 'abort\\n' .. THREAD .. '\\n' .. run .. '\\n' .. reason)
  end
end

local function reply(...)
  local out = {...}
  out[#out + 1] = ixop
  out[#out + 1] = fmt(ixscore)
  return out
end
"""
