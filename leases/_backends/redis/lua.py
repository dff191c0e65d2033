"""Lua scripts of the Redis lease backend: one round trip per operation, safe under replay.

A lease is the hash ``KEYS[1]`` = ``<prefix>:{<key>}`` with fields ``owner`` and ``token``, and
either

* a ``PX`` expiry of its own (a *per-key* lease), or
* a field ``session``: the lease lives exactly as long as the session key
  ``<prefix>:session:{<session>}`` (a *session* lease; no expiry of its own, so renewing the
  session renews every lease in it with one command).

A lease whose session key is gone reads as free. ``KEYS[2]`` is the fencing counter
``<prefix>:{<key>}:fence``, with no expiry, so tokens keep increasing across expiry and
release. Session keys are built inside the scripts from ``ARGV`` (sessions are refused on a
Redis Cluster, where that would cross slots; see :class:`~leases.RedisLeaseProvider`).

redis-py retries a command after a timeout or a dropped connection, so a script may run twice:
every script gives the same answer and state when replayed right after itself.
"""

from __future__ import annotations

from _signal_leases.lua import LEASE_FUNCTIONS

__all__ = ["ACQUIRE", "INFO", "OWNER", "RELEASE", "RENEW", "RENEW_MANY", "TRANSFER"]

_LIVE = LEASE_FUNCTIONS + """
local function live(key) return lease_live(key, ARGV[1]) end
"""

#: ARGV: session prefix, owner, ttl_ms, session ('' for a per-key lease).
#: Returns {1, owner, token} when granted (or already held by ``owner``: the token is kept,
#: so a replay is harmless), {0, holder, false} when held by another, {-1, false, false} when
#: the given session has expired.
ACQUIRE = _LIVE + """
local cur, dead = live(KEYS[1])
if cur then
  if cur[1] ~= ARGV[2] then return {0, cur[1], false} end
  if not cur[3] then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return {1, cur[1], cur[2]}
end
if not session_alive(ARGV[1], ARGV[4]) then return {-1, false, false} end
return {1, ARGV[2], lease_grant(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4], not dead)}
"""

#: ARGV: session prefix. Returns the live owner or false.
OWNER = _LIVE + """
local cur = live(KEYS[1])
if cur then return cur[1] end
return false
"""

#: ARGV: session prefix, owner. Deletes the lease only if ``owner`` holds it. Returns 1 then.
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: ARGV: session prefix, owner, ttl_ms. 1 if ``owner`` holds a live lease (a per-key lease's
#: TTL is reset; a session lease is renewed with its session). Never recreates a lease.
RENEW = _LIVE + """
local cur = live(KEYS[1])
if not cur or cur[1] ~= ARGV[2] then return 0 end
if not cur[3] then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
"""

#: KEYS: lease keys. ARGV: session prefix, ttl_ms, then one owner per key.
#: Renews every per-key lease its owner still holds; returns the 1-based indexes kept.
RENEW_MANY = _LIVE + """
local kept = {}
for i = 1, #KEYS do
  local cur = live(KEYS[i])
  if cur and cur[1] == ARGV[i + 2] then
    if not cur[3] then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
    kept[#kept + 1] = i
  end
end
return kept
"""

#: ARGV: session prefix, from_owner, to_owner, ttl_ms. Returns 1 on success.
#: If ``to_owner`` already holds the lease (a replay, or from == to) its TTL is refreshed and
#: the token kept; otherwise only ``from_owner`` may hand it over, with a new token. The
#: lease stays in its session, if it has one.
TRANSFER = _LIVE + """
local cur = live(KEYS[1])
if not cur then return 0 end
if cur[1] ~= ARGV[3] then
  if cur[1] ~= ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'token', redis.call('INCR', KEYS[2]))
end
if not cur[3] then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return 1
"""

#: ARGV: session prefix. {owner, token, pttl, session} of a live lease (pttl of the session
#: for a session lease), or {} when there is none.
INFO = _LIVE + """
local cur = live(KEYS[1])
if not cur then return {} end
local pttl
if cur[3] then
  pttl = redis.call('PTTL', ARGV[1] .. '{' .. cur[3] .. '}')
else
  pttl = redis.call('PTTL', KEYS[1])
end
return {cur[1], cur[2] or false, pttl, cur[3] or false}
"""
