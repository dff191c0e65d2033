"""Liveness keys and the sweep of leftovers of dead processes (Redis Streams backend).

Each entered ``RedisStreamsPubSub`` keeps ``<prefix>:alive:<process id>`` alive (TTL
``10 * reclaim_idle_ms``, refreshed by its reclaim loop, deleted on exit). Consumer idle times
can't tell a dead process from a quiet one (Redis 7.0 does not reset a consumer's idle time on
an XREADGROUP that returns nothing), the liveness key can. Every ``reclaim_idle_ms`` the process
sweeps each stream it reads:

* a private fan-out group ``fanout:<process id>`` whose process has no liveness key is destroyed
  (nobody else reads it; left alone it would hold a pending list forever);
* in the named groups this process belongs to, a consumer ``<group>:<process id>`` of a process
  without a liveness key and with nothing pending is forgotten (XGROUP DELCONSUMER; its pending
  entries are reclaimed first, by XAUTOCLAIM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._redis_support import text

if TYPE_CHECKING:
    import redis.asyncio
    from structlog.typing import FilteringBoundLogger

__all__ = ["FANOUT", "alive_key", "fanout_owner", "sweep_stream"]

FANOUT = "fanout"  # reserved group-name prefix of the private fan-out groups


def alive_key(prefix: str, process_id: str) -> str:
    """The liveness key of ``process_id`` under ``prefix``."""
    return f"{prefix}:alive:{process_id}"


def fanout_owner(group: str) -> str | None:
    """The process id in a private fan-out group's name, or ``None`` for other groups."""
    if not group.startswith(FANOUT + ":"):
        return None
    return group[len(FANOUT) + 1 :] or None  # the whole rest: a process id may contain ":"


async def sweep_stream(
    client: redis.asyncio.Redis,
    *,
    prefix: str,
    stream: str,
    own_groups: set[str],
    process_id: str,
    log: FilteringBoundLogger,
) -> None:
    """Destroy dead processes' fan-out groups on ``stream``; forget their idle consumers in
    ``own_groups`` (the named groups this process reads on ``stream``)."""
    alive: dict[str, bool] = {process_id: True}

    async def is_alive(pid: str) -> bool:
        if pid not in alive:
            alive[pid] = bool(await client.exists(alive_key(prefix, pid)))
        return alive[pid]

    groups: Any = await client.xinfo_groups(stream)
    for info in groups:
        name = text(info["name"])
        owner = fanout_owner(name)
        if owner is not None:
            if owner != process_id and not await is_alive(owner):
                await client.xgroup_destroy(stream, name)
                log.info("pubsub.fanout_group_reaped", stream=stream, group=name)
        elif name in own_groups:
            consumers: Any = await client.xinfo_consumers(stream, name)
            for consumer in consumers:
                cname = text(consumer["name"])
                if not cname.startswith(name + ":"):
                    continue  # not named by this library: leave it alone
                if int(consumer["pending"]) or await is_alive(cname[len(name) + 1 :]):
                    continue
                await client.xgroup_delconsumer(stream, name, cname)
                log.info(
                    "pubsub.consumer_forgotten", stream=stream, group=name, dead_consumer=cname
                )
