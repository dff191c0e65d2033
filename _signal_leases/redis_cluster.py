"""The Redis Cluster client of the library's backends (see :class:`WaitingRedisCluster`)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio

__all__ = ["DEFAULT_MAX_CONNECTIONS", "WaitingRedisCluster"]

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
