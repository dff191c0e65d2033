"""``RedisLeaseProvider``: ``provider`` (the calls) and ``lua`` (its scripts)."""
