"""Subscription state of the Redis Streams backend: one :class:`Slot` per (stream, group) this
process reads, and the :class:`RedisSubscription` members that handle its entries.

A named group's members in this process share the slot's queue and compete; each fan-out
member has a queue of its own, gets a copy of every entry after its start position
(``after``), and the entry is acknowledged once every member holding it is done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio

from _signal_leases.aio import WakeQueue
from _signal_leases.errors import BackendError
from _signal_leases.redis.support import map_errors, stream_id, text
from pubsub._contract import Event, EventHandler
from pubsub._delivery import LoopSubscription, deliver_with_retries

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from pubsub._backends.redis.layout import StreamsContext

__all__ = ["PAGE", "READ_COUNT", "Item", "RedisSubscription", "Slot"]

PAGE = 1000  # entries per XRANGE / XPENDING page
READ_COUNT = 32  # entries per stream per XREADGROUP

Item: TypeAlias = tuple[str | None, Event]
"""A queued delivery: the stream entry id (``None`` for a replayed, never-acked copy), event."""


@dataclass(eq=False)
class Slot:
    """One (stream, group) this process reads, with its local members."""

    ctx: StreamsContext
    topic: str
    stream: str
    group: str
    consumer: str
    fanout: bool
    ready: anyio.Event = field(default_factory=anyio.Event)  # the group exists
    members: list[RedisSubscription] = field(default_factory=list)
    queue: WakeQueue[Item] = field(default_factory=WakeQueue)  # competing members share it
    refs: dict[str, int] = field(default_factory=dict)  # fan-out: entry id -> handlers left
    inflight: set[str] = field(default_factory=set)  # entry ids queued, handled, or to ack
    acks: list[str] = field(default_factory=list)  # handled: XACKed with the reader's next read
    last_id: str = "0-0"  # the group's position as far as this process knows (only grows)
    live: bool = True  # False once retired (its last member left): hand it nothing more
    throttled: bool = False  # skipped by the reader: enough is queued here

    @property
    def key(self) -> tuple[str, str]:
        return (self.topic, self.group)

    @property
    def public_group(self) -> str | None:
        """The group as subscribers named it (``None`` for fan-out)."""
        return None if self.fanout else self.group

    def wants_read(self) -> bool:
        """Read more only while the local backlog is short, so one process never hoards a
        group's entries (they would sit pending here while other consumers are idle)."""
        if self.fanout:
            return max((len(m.queue) for m in self.members), default=0) < READ_COUNT
        return len(self.queue) < max(1, len(self.members))

    def advance(self, entry_id: str) -> None:
        """The group delivered up to ``entry_id``: move :attr:`last_id` forward (never back)."""
        if stream_id(entry_id) > stream_id(self.last_id):
            self.last_id = entry_id

    def parse(self, entry_id: str, fields: dict[Any, Any]) -> Event | None:
        raw = fields.get(b"event", fields.get("event"))
        try:
            if raw is None:
                raise KeyError("no 'event' field")
            return Event.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            self.ctx.log.warning(
                "pubsub.malformed_entry", topic=self.topic, entry_id=entry_id, error=repr(exc)
            )
            return None

    def dispatch(self, entry_id: str, fields: dict[Any, Any], attempt: int) -> bool:
        """Queue an entry read from Redis for the members; ``True``: XACK it now."""
        if not self.live or not self.members:
            return False  # the subscription closed meanwhile: the entry stays pending
        if entry_id in self.inflight:
            return False  # already queued here (a pending re-read raced the reader)
        event = self.parse(entry_id, fields)
        if event is None:
            return True  # never deliverable
        if attempt > self.ctx.settings.max_delivery_attempts:  # it crashed every process
            self.ctx.log.warning(
                "pubsub.event_dropped",
                topic=self.topic,
                group=self.public_group,
                event_id=event.id,
                attempts=attempt - 1,
            )
            return True
        if attempt > event.delivery_attempt:
            event = Event(event.type, event.data, event.id, event.created_at, attempt)
        if not self.fanout:
            self.inflight.add(entry_id)
            self.queue.put((entry_id, event))
            return False
        sid = stream_id(entry_id)
        members = [m for m in self.members if not m.closing and (m.after is None or sid > m.after)]
        if not members:
            return True
        self.refs[entry_id] = len(members)
        self.inflight.add(entry_id)
        for member in members:
            member.queue.put((entry_id, event))
        return False

    def release(self, entry_id: str) -> bool:
        """One holder is done with ``entry_id``; ``True`` when it is time to XACK it."""
        if self.fanout:
            left = self.refs.get(entry_id, 1) - 1
            if left > 0:
                self.refs[entry_id] = left
                return False
            self.refs.pop(entry_id, None)
        self.inflight.discard(entry_id)
        return True

    def ack_later(self, entry_id: str) -> None:
        """Acknowledge the handled ``entry_id`` with the reader's next read of this slot (one
        pipeline, no round trip of its own). Only for the entry whose handling drained a slot
        the reader skipped: its member wakes the reader at once (a slow handler never holds
        up the XACK of what was handled before it). It stays in :attr:`inflight` until sent,
        so the upkeep neither reclaims it nor lets it look idle."""
        self.inflight.add(entry_id)
        self.acks.append(entry_id)

    def take_acks(self) -> list[str]:
        """The acknowledgements waiting for the reader (now the caller's to send)."""
        ids, self.acks = self.acks, []
        return ids

    def acks_sent(self, entry_ids: list[str]) -> None:
        self.inflight.difference_update(entry_ids)

    async def flush_acks(self) -> None:
        """Send the waiting acknowledgements now (a member leaves)."""
        ids = self.take_acks()
        await self.ack(ids)
        self.acks_sent(ids)

    async def ack(self, entry_ids: list[str]) -> None:
        """XACK ``entry_ids``; on failure they stay pending and come again (at least once)."""
        if not entry_ids:
            return
        try:
            with anyio.move_on_after(5), map_errors("XACK"):
                await self.ctx.client.xack(self.stream, self.group, *entry_ids)
        except BackendError as exc:
            self.ctx.log.warning(
                "pubsub.ack_failed", topic=self.topic, entry_ids=entry_ids, error=repr(exc)
            )

    async def delivery_counts(self, entry_ids: list[str]) -> dict[str, int]:
        """Redis's delivery count of each of ``entry_ids`` (in stream order) in this group."""
        if not entry_ids:
            return {}
        rows: Any = await self.ctx.client.xpending_range(
            self.stream, self.group, min=entry_ids[0], max=entry_ids[-1],
            count=len(entry_ids) + PAGE,
        )
        return {text(r["message_id"]): int(r["times_delivered"]) for r in rows}


class RedisSubscription(LoopSubscription):
    """A member of a :class:`Slot`. Closing it lets the entry in hand finish, then calls
    ``detach`` (which retires the slot when it was the last member)."""

    def __init__(
        self,
        slot: Slot,
        handler: EventHandler,
        *,
        detach: Callable[[RedisSubscription], Awaitable[None]],
        wake_reader: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(slot.topic, slot.public_group)
        self.slot = slot
        self.handler = handler
        self.queue: WakeQueue[Item] = WakeQueue()  # fan-out: each member gets its own copy
        self.after: tuple[int, int] | None = None  # fan-out: only entries with a greater id
        self._detach = detach
        self._wake_reader = wake_reader

    async def close(self) -> None:
        await super().close()
        with anyio.CancelScope(shield=True):
            await self._detach(self)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve this member until it is closed (the task the backend's task group runs)."""
        queue = self.queue if self.slot.fanout else self.slot.queue
        await self.serve(queue, self._handle, task_status=task_status)

    async def _handle(self, item: Item) -> None:
        entry_id, event = item
        slot = self.slot

        async def note_retry(retry: Event) -> None:
            # Keep Redis's delivery count equal to the attempt number, so that a process that
            # takes the entry over after a crash continues the count instead of restarting it.
            if entry_id is None or slot.fanout:
                return
            try:
                with anyio.move_on_after(5), map_errors("XCLAIM"):
                    await slot.ctx.client.xclaim(
                        slot.stream, slot.group, slot.consumer, 0, [entry_id],
                        retrycount=retry.delivery_attempt, justid=True,
                    )
            except BackendError as exc:
                slot.ctx.log.debug("pubsub.retry_count_failed", entry_id=entry_id, error=repr(exc))

        await deliver_with_retries(
            self.handler,
            event,
            max_attempts=slot.ctx.settings.max_delivery_attempts,
            topic=slot.topic,
            group=self.group,
            on_retry=note_retry,
        )
        if entry_id is not None and slot.release(entry_id):
            if slot.throttled and slot.wants_read():  # the reader is woken just below
                slot.ack_later(entry_id)
            else:
                await slot.ack([entry_id])
        if slot.throttled and slot.wants_read():
            slot.throttled = False
            await self._wake_reader()
