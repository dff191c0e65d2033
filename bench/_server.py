"""The Redis server of a benchmark run: the one given with ``--redis-url``, or one started here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests._redis_server import RedisServer, redis_server_binary

__all__ = ["redis_url"]


@contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    """``given``, or the URL of a ``redis-server`` started on a free loopback port and stopped
    on exit (``SystemExit`` with a message when none is installed)."""
    if given is not None:
        yield given
        return
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server is not installed; pass --redis-url")
    with RedisServer(binary) as server:
        yield server.url
