"""``RedisStreamsPubSub``.

``streams`` (the facade), ``layout`` (names, settings, context), ``groups``, ``slots``,
``reader`` and ``housekeeping``.
"""
