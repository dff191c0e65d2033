"""The private foundation shared by ``leases``, ``pubsub`` and ``signals``.

Nothing here is public API. The three public packages import from it (and only downward from
each other: leases -> pubsub -> signals); it imports none of them. What lives here:

* :mod:`.errors`: the one error tree (each public package re-exports its part).
* :mod:`.validation`: one checker per kind of argument, one rule for ``bool`` and bounds.
* :mod:`.redis`: Redis plumbing. :mod:`.redis.support`: the client owner (``url`` or
  ``client``, timeouts, pool, closing), the error mapper and small reply decoders;
  :mod:`.redis.pools`: the waiting pools and the connections' quick writes and packing;
  :mod:`.redis.script`: a Lua script called by ``EVALSHA``.
* :mod:`.keys`: the Redis key layout of every layer, hash-tagged per thread.
* :mod:`.lua`: Lua fragments the lease and signal scripts share (reading and granting leases).
* :mod:`.aio`: small anyio helpers (a wakeable queue, the asyncio check).
"""
