"""The Redis signal store.

``inbox`` (the client, key layout and script calls every part shares), ``fused`` (route,
claim, release, abort with the leases), ``store`` (the inbox calls), ``lua`` and ``lua_calls``
(its scripts), ``presence`` (pending index, registry, notices), ``output`` (streams and the
follower), ``parts`` (stream parts and their waiters), ``follower`` (one per process, for
every stream reader) and ``sender`` (``RedisSignalSender``: ``inbox`` and ``fused`` only, for
a process that only sends).
"""
