"""Lua scripts of the Redis lease backend: one round trip per operation, safe under replay.

Keys (always passed via ``KEYS``): ``KEYS[1]`` is the lease hash ``<prefix>:{<key>}`` with
fields ``owner`` and ``token`` and a ``PX`` expiry; ``KEYS[2]`` is the fencing counter
``<prefix>:{<key>}:fence``, a plain integer with no expiry, so tokens keep increasing across
expiry and release. Both share the ``{<key>}`` hash tag, hence one Cluster slot.

redis-py retries a command after a timeout or a dropped connection, so a script may run twice:
every script gives the same answer and state when replayed right after itself.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "INFO", "RELEASE", "RENEW", "TRANSFER"]

#: ARGV: owner, ttl_ms. Returns {acquired 0/1, owner or false, token or false}.
#: The same owner re-acquiring refreshes the TTL and keeps the token (so a replay is harmless).
ACQUIRE = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] then
  if cur[1] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, cur[1], cur[2]}
  end
  return {0, cur[1], false}
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, ARGV[1], token}
"""

#: ARGV: owner. Deletes the lease only if ``owner`` holds it. Returns 1 when deleted.
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: ARGV: owner, ttl_ms. Resets the TTL only if ``owner`` holds a live lease (never recreates).
RENEW = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

#: ARGV: from_owner, to_owner, ttl_ms. Returns 1 on success.
#: If ``to_owner`` already holds the lease (a replay of this transfer, or from == to) the TTL is
#: refreshed and the token kept; otherwise only ``from_owner`` may hand it over, with a new token.
TRANSFER = """
local cur = redis.call('HGET', KEYS[1], 'owner')
if not cur then
  return 0
end
if cur == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if cur ~= ARGV[1] then
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

#: No ARGV. Returns {owner, token, pttl} of a live lease, or {} when there is none.
INFO = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if not cur[1] then
  return {}
end
return {cur[1], cur[2] or false, redis.call('PTTL', KEYS[1])}
"""
