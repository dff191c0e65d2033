"""Upkeep of the Redis Streams backend: liveness, held entries, reclaim, and the sweep of dead
processes' leftovers.

Each entered ``RedisStreamsPubSub`` that subscribes keeps ``<prefix>:alive:<process id>``
alive (from just before its first consumer group; a process that only publishes, a serverless
sender say, writes none): its TTL,
``10 * reclaim_idle_ms``, is the bound after which the others may take the process for dead
(the value holds the same number, for operators); refreshed at least every
``reclaim_idle_ms / 3``, deleted on exit. Consumer idle times can't tell a dead process from a
quiet one (Redis 7.0 does not reset a consumer's idle time on an XREADGROUP that returns
nothing); the liveness key can. The loop:

* every pass: refresh the liveness key, and reset the idle time of the entries this process
  holds in named groups (XCLAIM ... JUSTID), so a slow handler is not mistaken for a dead one;
* every ``reclaim_interval_ms``: XAUTOCLAIM entries of its named groups idle longer than
  ``reclaim_idle_ms`` (a dead consumer's) and hand them to the slot;
* every ``reclaim_idle_ms``: on each stream it reads, destroy the private fan-out groups of
  processes without a liveness key (nobody else reads them; left alone they would hold a
  pending list forever), and forget (XGROUP DELCONSUMER) such processes' consumers in its named
  groups once nothing is pending on them; retry destroying its own orphaned groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from _signal_leases.aio import loop_time
from _signal_leases.errors import BackendError
from _signal_leases.redis.support import map_errors, text
from pubsub._backends.redis.slots import PAGE, Slot

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from pubsub._backends.redis.groups import GroupTable
    from pubsub._backends.redis.layout import StreamsContext

__all__ = ["Housekeeper", "sweep_stream"]


class Housekeeper:
    """The upkeep loop of one process (see the module docstring)."""

    def __init__(self, groups: GroupTable) -> None:
        self._groups = groups
        self._ctx = groups.ctx
        self._alive_key = self._ctx.layout.alive(self._ctx.process_id)
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        self._alive = False  # the key exists (set before this process's first group)

    def stop(self) -> None:
        """End :meth:`run` (the loop only: the task group's scope stays untouched)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def beat(self) -> None:
        """Refresh this process's liveness key."""
        ttl_ms = self._ctx.settings.alive_ttl_ms
        await self._ctx.client.set(self._alive_key, ttl_ms, px=ttl_ms)

    async def ensure_alive(self) -> None:
        """Write the liveness key unless written already: before this process creates its
        first consumer group, so no other process takes that group for a dead one's."""
        if not self._alive:
            await self.beat()
            self._alive = True

    async def forget_self(self) -> None:
        """Delete this process's liveness key (at exit, after its groups are gone)."""
        if not self._alive:
            return
        try:
            with map_errors("DEL"):
                await self._ctx.client.delete(self._alive_key)
        except BackendError as exc:
            self._ctx.log.debug("pubsub.heartbeat_failed", error=repr(exc))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Upkeep until :meth:`stop`. Every pass (at most a third of ``reclaim_idle_ms``
        apart, so held entries never look idle): liveness key, held entries. Every
        ``reclaim_interval_ms``: XAUTOCLAIM. Every ``reclaim_idle_ms``: the sweep."""
        settings = self._ctx.settings
        period = min(settings.reclaim_interval_ms, max(1, settings.reclaim_idle_ms // 3)) / 1000
        with anyio.CancelScope() as self._scope:
            task_status.started()
            if self._stopped:
                return
            last_reclaim = last_sweep = loop_time()
            while True:
                await anyio.sleep(period)
                now = loop_time()
                reclaim = now - last_reclaim >= settings.reclaim_interval_ms / 1000 - 1e-3
                sweep = now - last_sweep >= settings.reclaim_idle_ms / 1000 - 1e-3
                try:
                    if self._alive:
                        with map_errors("SET"):
                            await self.beat()
                except BackendError as exc:
                    self._ctx.log.warning("pubsub.heartbeat_failed", error=repr(exc))
                for slot in list(self._groups.slots.values()):
                    if slot.fanout or not slot.members or not slot.ready.is_set():
                        continue
                    try:
                        with map_errors("XAUTOCLAIM"):
                            await self._refresh_held(slot)
                            if reclaim:
                                await self._reclaim(slot)
                    except BackendError as exc:
                        self._ctx.log.warning(
                            "pubsub.reclaim_failed", topic=slot.topic, error=repr(exc)
                        )
                if reclaim:
                    last_reclaim = now
                if sweep:
                    last_sweep = now
                    await self._sweep()

    async def _sweep(self) -> None:
        streams: dict[str, set[str]] = {}
        for slot in list(self._groups.slots.values()):
            names = streams.setdefault(slot.stream, set())
            if not slot.fanout:
                names.add(slot.group)
        for stream, own_groups in streams.items():
            try:
                with map_errors("XINFO GROUPS"):
                    await sweep_stream(self._ctx, stream=stream, own_groups=own_groups)
            except BackendError as exc:
                self._ctx.log.debug("pubsub.sweep_failed", stream=stream, error=repr(exc))
        await self._groups.retry_orphans()

    async def _refresh_held(self, slot: Slot) -> None:
        """Reset the idle time of entries this process holds (queued or being handled), so a
        live process's slow handler is not mistaken for a dead consumer's."""
        if not slot.inflight:
            return
        client = self._ctx.client
        rows: Any = await client.xpending_range(
            slot.stream, slot.group, "-", "+", count=len(slot.inflight) + PAGE,
            consumername=slot.consumer,
        )
        held = [text(r["message_id"]) for r in rows if text(r["message_id"]) in slot.inflight]
        if held:
            await client.xclaim(slot.stream, slot.group, slot.consumer, 0, held, justid=True)

    async def _reclaim(self, slot: Slot) -> None:
        cursor = "0-0"
        while True:
            reply: Any = await self._ctx.client.xautoclaim(
                slot.stream, slot.group, slot.consumer, self._ctx.settings.reclaim_idle_ms,
                start_id=cursor, count=100,
            )
            cursor = text(reply[0])
            deleted = [text(d) for d in (reply[2] if len(reply) > 2 else [])]
            await slot.ack(deleted)  # trimmed away while pending: nothing to deliver
            fresh = [(text(i), f) for i, f in reply[1] if f and text(i) not in slot.inflight]
            counts = await slot.delivery_counts([i for i, _ in fresh])
            to_ack = []
            for entry_id, fields in fresh:
                self._ctx.log.info("pubsub.reclaimed", topic=slot.topic, entry_id=entry_id)
                if slot.dispatch(entry_id, fields, counts.get(entry_id, 2)):
                    to_ack.append(entry_id)
            await slot.ack(to_ack)
            if cursor == "0-0":
                return


async def sweep_stream(ctx: StreamsContext, *, stream: str, own_groups: set[str]) -> None:
    """Destroy dead processes' fan-out groups on ``stream``; forget their idle consumers in
    ``own_groups`` (the named groups this process reads on ``stream``)."""
    client, layout = ctx.client, ctx.layout
    alive: dict[str, bool] = {ctx.process_id: True}

    async def is_alive(pid: str) -> bool:
        if pid not in alive:
            alive[pid] = bool(await client.exists(layout.alive(pid)))
        return alive[pid]

    groups: Any = await client.xinfo_groups(stream)
    for info in groups:
        name = text(info["name"])
        owner = layout.fanout_owner(name)
        if owner is not None:
            if owner != ctx.process_id and not await is_alive(owner):
                await client.xgroup_destroy(stream, name)
                ctx.log.info("pubsub.fanout_group_reaped", stream=stream, group=name)
        elif name in own_groups:
            consumers: Any = await client.xinfo_consumers(stream, name)
            for consumer in consumers:
                cname = text(consumer["name"])
                if not cname.startswith(name + ":"):
                    continue  # not named by this library: leave it alone
                if int(consumer["pending"]) or await is_alive(cname[len(name) + 1 :]):
                    continue
                await client.xgroup_delconsumer(stream, name, cname)
                ctx.log.info(
                    "pubsub.consumer_forgotten", stream=stream, group=name, dead_consumer=cname
                )
