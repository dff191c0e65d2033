"""The waiting clients of the library's Redis backends: a busy pool is latency, never an
error. :class:`WaitingConnectionPool` for a standalone Redis, :class:`WaitingRedisCluster` for
a Cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import AbstractConnection

__all__ = ["DEFAULT_MAX_CONNECTIONS", "WaitingConnectionPool", "WaitingRedisCluster"]

#: Connections in the pool of a client built from a URL (callers wait beyond that).
DEFAULT_MAX_CONNECTIONS = 32


class WaitingRedisCluster(redis.asyncio.RedisCluster):
    """A ``RedisCluster`` whose callers *wait* for a connection instead of failing.

    redis-py's per-node pools raise ``MaxConnectionsError`` as soon as a node has
    ``max_connections`` commands in flight; the standalone clients of this library wait
    instead (a busy pool is latency, never an error). This client lets at most
    ``command_slots`` commands run at once (the others wait their turn) and gives every node
    a pool twice that size, so single commands never exhaust a node and pipelines (which
    take one connection per node besides) have room too.
    """

    def __init__(self, *args: Any, command_slots: int = DEFAULT_MAX_CONNECTIONS,
                 **kwargs: Any) -> None:
        kwargs["max_connections"] = 2 * command_slots
        super().__init__(*args, **kwargs)
        self._command_slots = asyncio.Semaphore(command_slots)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._command_slots:
            return await super().execute_command(*args, **kwargs)


class WaitingConnectionPool(redis.asyncio.BlockingConnectionPool):
    """redis-py's ``BlockingConnectionPool`` (with ``max_connections`` in use, a caller waits
    up to ``timeout`` for one), with a fast path: while a connection is free, or one more may
    be opened, a command takes it as a plain ``ConnectionPool`` does (one lock), without the
    condition variable and the timer the waiting path sets up for every checkout (10-20 µs
    per command here, a tenth of a command's CPU); and a release notifies the condition only
    while somebody waits on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = 0  # callers in the waiting path

    def _waiters(self) -> bool:
        # (a method, not the attribute in place: release() reads it again after an await,
        # where it may have changed, which a type checker's narrowing would not allow)
        return self._waiting > 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.can_get_connection():
            try:
                return await _PLAIN.get_connection(self)
            except redis.exceptions.ConnectionError:
                if self.can_get_connection():
                    raise  # a failure to connect (taken and given back), not a full pool
        self._waiting += 1  # before the condition checks for a free connection
        try:
            waiting: Any = super()
            return await waiting.get_connection(*args, **kwargs)
        finally:
            self._waiting -= 1

    async def release(self, connection: AbstractConnection) -> None:
        if self._waiters():
            await super().release(connection)  # and notifies a waiter
            return
        await _PLAIN.release(self, connection)
        if self._waiters():  # one began to wait meanwhile (it had seen no free connection)
            async with self._condition:
                self._condition.notify()


_PLAIN: Any = redis.asyncio.ConnectionPool  # its methods, on a WaitingConnectionPool
