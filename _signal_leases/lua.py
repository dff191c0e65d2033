"""Lua fragments shared by the scripts of the lease and signal layers (Redis backends).

A script that reads or grants a lease prepends :data:`LEASE_FUNCTIONS` and calls them with the
session-key prefix (``<lease prefix>:session:``), so every layer reads the lease record the same
way (see :mod:`leases._backends.redis.lua` for the record's layout).
"""

from __future__ import annotations

__all__ = ["LEASE_FUNCTIONS"]

LEASE_FUNCTIONS = """
local function lease_live(key, sp)
  local cur = redis.call('HMGET', key, 'owner', 'token', 'session')
  if not cur[1] then return nil, false end
  if cur[3] and redis.call('EXISTS', sp .. '{' .. cur[3] .. '}') == 0 then return nil, true end
  return cur
end
local function session_alive(sp, session)
  return session == '' or redis.call('EXISTS', sp .. '{' .. session .. '}') == 1
end
local function lease_grant(key, fence, owner, ttl, session, fresh)
  local token = redis.call('INCR', fence)
  -- a dead session's record may linger: start clean (``fresh``: the caller saw no record)
  if not fresh then redis.call('DEL', key) end
  if session ~= '' then
    redis.call('HSET', key, 'owner', owner, 'token', token, 'session', session)
  else
    redis.call('HSET', key, 'owner', owner, 'token', token)
    redis.call('PEXPIRE', key, ttl)
  end
  return token
end
"""
