"""The consumer groups of one process (Redis Streams backend): which slots it reads, where
each group and each member starts, and when a private fan-out group is destroyed.

Positions. Every group creation reads the group's position in the same MULTI, so
:attr:`Slot.last_id` always holds where the group stands (it then grows with each read):

* a fresh private fan-out group replaces any group of its name (a leftover of an earlier run
  with the same ``consumer_name``: its position and pending list mean nothing now) and starts
  at ``$`` (``latest``) or ``0`` (``earliest``); a ``latest`` member never sees an entry at or
  before that position (``after``);
* a member joining a live fan-out slot gets its own start: the stream's end (``latest``) or an
  XRANGE replay up to the group's position (``earliest``);
* a named group is created at the requested start, or keeps its position if it exists;
* after ``NOGROUP`` (the stream expired or was deleted, or the group was destroyed) a live
  slot's group is recreated at :attr:`Slot.last_id`: nothing published since is skipped and
  nothing before is replayed.

Retirement. When the last member of a slot leaves, the slot is dropped at once (the reader
and the upkeep stop handing it anything and never recreate its group); a private group is
then destroyed, and a new subscription to the same topic waits for that. A destroy that
fails leaves an *orphan*, retried by the upkeep and at exit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from _signal_leases.errors import BackendError
from _signal_leases.redis.support import atomic_pipeline, map_errors, stream_id, text
from pubsub._backends.redis.slots import PAGE, Item, RedisSubscription, Slot

if TYPE_CHECKING:
    from pubsub._backends.redis.layout import StreamsContext
    from pubsub._contract import Event, StartFrom

__all__ = ["GroupTable"]


class GroupTable:
    """The slots this process reads, keyed by (topic, group name)."""

    def __init__(self, ctx: StreamsContext) -> None:
        self.ctx = ctx
        self.slots: dict[tuple[str, str], Slot] = {}
        self.orphans: dict[tuple[str, str], str] = {}  # (stream, group) -> topic: not destroyed
        self._retiring: dict[tuple[str, str], anyio.Event] = {}

    # -- opening ---------------------------------------------------------------------------

    async def open(self, topic: str, group: str | None, start_from: StartFrom) -> tuple[Slot, bool]:
        """The slot of (topic, group), creating its Redis group if needed; ``True`` if new."""
        ctx = self.ctx
        fanout = group is None
        name = ctx.layout.fanout_group(ctx.process_id) if group is None else group
        key = (topic, name)
        while True:
            retiring = self._retiring.get(key)
            if retiring is not None:  # the previous slot's group is being destroyed
                await retiring.wait()
                continue
            slot = self.slots.get(key)
            if slot is None:
                break
            await slot.ready.wait()
            if self.slots.get(key) is slot:  # not dropped after a failed creation
                return slot, False
        consumer = ctx.process_id if fanout else ctx.layout.consumer(name, ctx.process_id)
        slot = Slot(ctx, topic, ctx.layout.stream(topic), name, consumer, fanout)
        self.slots[key] = slot
        try:
            with map_errors(f"subscribe to {topic!r}"):
                start = "$" if start_from == "latest" else "0"
                await self._create(slot, start, replace=fanout)
        except BaseException:
            if self.slots.get(key) is slot:
                del self.slots[key]
            raise
        finally:
            slot.ready.set()
        self.orphans.pop((slot.stream, slot.group), None)
        return slot, True

    async def _create(self, slot: Slot, start: str, *, replace: bool) -> None:
        """XGROUP CREATE at ``start`` (MKSTREAM; an existing group keeps its position unless
        ``replace``), the idle TTL, and the group's position, in one MULTI."""
        async with atomic_pipeline(self.ctx.client) as pipe:
            if replace:
                pipe.xgroup_destroy(slot.stream, slot.group)
            pipe.xgroup_create(slot.stream, slot.group, id=start, mkstream=True)
            self.ctx.queue_idle_ttl(pipe, slot.stream)
            pipe.xinfo_groups(slot.stream)
            results = await pipe.execute(raise_on_error=False)
        created = results[1 if replace else 0]
        if isinstance(created, Exception) and "BUSYGROUP" not in str(created):
            raise created
        groups = results[-1]
        if isinstance(groups, Exception):
            raise groups
        for info in groups:
            if text(info["name"]) == slot.group:
                slot.advance(text(info["last-delivered-id"]))

    async def recreate(self, slot: Slot) -> None:
        """After ``NOGROUP``: recreate a live slot's group at its last known position."""
        if not slot.live or not slot.members:
            return
        try:
            with map_errors(f"recreate the group of {slot.topic!r}"):
                await self._create(slot, slot.last_id, replace=False)
        except BackendError as exc:
            self.ctx.log.warning("pubsub.reader_error", error=repr(exc))

    # -- members ---------------------------------------------------------------------------

    async def attach(
        self, slot: Slot, sub: RedisSubscription, *, fresh: bool, start_from: StartFrom
    ) -> None:
        """Make ``sub`` a member of ``slot``, with its own start when it is a fan-out slot."""
        slot.members.append(sub)  # from here on the reader hands entries to it
        if not slot.fanout:
            return
        if fresh:
            if start_from == "latest":
                sub.after = stream_id(slot.last_id)
            return
        await self._position(slot, sub, start_from)

    async def _position(self, slot: Slot, sub: RedisSubscription, start_from: StartFrom) -> None:
        """Give a fan-out member joining a live slot its own start: entries up to ``cut`` are
        not its business (``"latest"``) or come from an XRANGE replay (``"earliest"``)."""
        client = self.ctx.client
        backlog: list[Event] = []
        with map_errors(f"subscribe to {slot.topic!r}"):
            if start_from == "latest":
                last: Any = await client.xrevrange(slot.stream, "+", "-", count=1)
                cut = stream_id(last[0][0]) if last else (0, 0)
            else:
                cut = stream_id(slot.last_id)
                backlog = await self._replay(slot, cut)
        to_ack: list[str] = []
        kept: list[Item] = []
        for entry_id, event in sub.queue.drain():  # handed over before the cut was known
            if entry_id is not None and stream_id(entry_id) <= cut:
                if slot.release(entry_id):
                    to_ack.append(entry_id)
            else:
                kept.append((entry_id, event))
        sub.after = cut
        for event in backlog:
            sub.queue.put((None, event))
        for item in kept:
            sub.queue.put(item)
        await slot.ack(to_ack)

    async def _replay(self, slot: Slot, cut: tuple[int, int]) -> list[Event]:
        events: list[Event] = []
        if cut == (0, 0):
            return events
        start, end = "-", f"{cut[0]}-{cut[1]}"
        while True:
            rows: Any = await self.ctx.client.xrange(slot.stream, start, end, count=PAGE)
            for entry_id, fields in rows:
                event = slot.parse(text(entry_id), fields)
                if event is not None:
                    events.append(event)
            if len(rows) < PAGE:
                return events
            start = "(" + text(rows[-1][0])

    async def read_own_pending(self, slot: Slot) -> None:
        """Take back what this consumer had been handed but not acknowledged (an earlier
        subscription of this process, or a reply lost in a reconnect)."""
        start = "0"
        while True:
            with map_errors(f"subscribe to {slot.topic!r}"):
                reply: Any = await self.ctx.client.xreadgroup(
                    slot.group, slot.consumer, {slot.stream: start}, count=PAGE
                )
                entries = reply[0][1] if reply else []
                counts = await slot.delivery_counts([text(i) for i, _ in entries])
            to_ack = [
                text(entry_id)
                for entry_id, fields in entries
                if fields and slot.dispatch(text(entry_id), fields, counts.get(text(entry_id), 2))
            ]
            await slot.ack(to_ack)
            if len(entries) < PAGE:
                return
            start = text(entries[-1][0])

    async def detach(self, sub: RedisSubscription) -> None:
        """``sub`` stopped: drop it from its slot, and retire the slot if it was the last."""
        slot = sub.slot
        if sub not in slot.members:
            return
        slot.members.remove(sub)
        await slot.flush_acks()  # what the reader was to acknowledge with its next read
        if slot.fanout:  # what this member will not handle no longer holds up the ack
            to_ack = [
                entry_id
                for entry_id, _event in sub.queue.drain()
                if entry_id is not None and slot.release(entry_id)
            ]
            await slot.ack(to_ack)
        if slot.members or self.slots.get(slot.key) is not slot:
            return
        # The last member left. A named group's queued entries stay pending in Redis for a
        # later subscription; a private group goes.
        del self.slots[slot.key]
        slot.live = False
        if not slot.fanout:
            return
        done = self._retiring[slot.key] = anyio.Event()
        try:
            await self.destroy(slot.topic, slot.stream, slot.group)
        finally:
            del self._retiring[slot.key]
            done.set()

    # -- destroying ------------------------------------------------------------------------

    async def destroy(self, topic: str, stream: str, group: str) -> None:
        """XGROUP DESTROY a private group; if that fails, keep it as an orphan to retry."""
        self.orphans[(stream, group)] = topic
        with anyio.move_on_after(2):
            try:
                with map_errors("XGROUP DESTROY"):
                    await self.ctx.client.xgroup_destroy(stream, group)
            except BackendError as exc:
                self.ctx.log.debug("pubsub.group_destroy_failed", topic=topic, error=repr(exc))
            else:
                self.orphans.pop((stream, group), None)

    async def retry_orphans(self) -> None:
        """Destroy the orphans no live slot uses again."""
        in_use = {(s.stream, s.group) for s in self.slots.values()}
        for (stream, group), topic in list(self.orphans.items()):
            if (stream, group) not in in_use:
                await self.destroy(topic, stream, group)

    async def destroy_all(self) -> None:
        """At exit: drop every slot and destroy every private group (one round trip)."""
        slots, self.slots = list(self.slots.values()), {}
        targets = {(s.stream, s.group) for s in slots if s.fanout} | set(self.orphans)
        for slot in slots:
            slot.live = False
        if not targets:
            return
        async with self.ctx.client.pipeline(transaction=False) as pipe:
            for stream, group in targets:
                pipe.xgroup_destroy(stream, group)
            await pipe.execute(raise_on_error=False)
        self.orphans.clear()
