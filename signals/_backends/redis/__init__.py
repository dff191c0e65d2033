"""The Redis signal store.

``store`` (the inbox calls), ``lua`` (its scripts), ``presence`` (pending index, registry,
notices), ``dead`` (dead letters), ``output`` (streams and the follower), ``parts`` (stream
parts and their waiters) and ``follower`` (one per process, for every stream reader).
"""
