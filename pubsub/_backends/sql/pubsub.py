"""``SQLPubSub``: at-least-once pub/sub in a SQL database, woken by a doorbell.

Events are rows (``tables``). Each process has one reader task: it fetches new events for its
subscriptions when the doorbell rings (another process published), when this process
publishes, and every ``poll_ms`` in any case (a lost ring costs at most that). A fan-out
subscription keeps its cursor in memory; a group subscription claims events in the database
(``ps_claims``), so the members of a group compete across processes, and a member that dies
leaves claims that time out (``visibility_ms``) and go to another member, their attempt
counted. A live member keeps its claims fresh, so a slow handler is never taken over. Each
subscription has its own task that hands events to its handler one at a time, in order, with
in-place redelivery (``pubsub._delivery``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio

import _signal_leases.sql.leases as sql_leases
import pubsub._backends.sql.tables as ps
from _signal_leases.aio import WakeQueue, loop_time, owned_task_group
from _signal_leases.logs import get_logger
from _signal_leases.sql import Tx
from _signal_leases.validation import check_identifier, check_int
from pubsub._base import PubSubBase
from pubsub._contract import DEFAULT_MAX_DELIVERY_ATTEMPTS, Event, EventHandler, StartFrom
from pubsub._delivery import LoopSubscription, deliver_with_retries
from pubsub._leased import LeasedPubSub

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from _signal_leases.sql import Database
    from leases import SQLLeaseProvider

__all__ = ["Doorbell", "SQLPubSub"]

logger = get_logger("pubsub")

_PRUNE_S = 60.0


class Doorbell(Protocol):
    """How one process tells the others that it published (see the module docstring).

    A doorbell whose database can signal inside a transaction (Postgres ``NOTIFY``, sent at
    commit) also has ``ring_in(tx, topics)``, a synchronous method the pub/sub then calls in
    the publishing transaction instead of :meth:`ring` after it. A doorbell that hears every
    ring (one ``NOTIFY`` channel) may have an attribute ``wanted``: the pub/sub sets it to a
    thread-safe ``wanted(topic) -> bool`` (a topic this process reads), so that rings for
    other processes' topics wake nothing here.
    """

    async def ring(self, topics: Collection[str]) -> None:
        """After a commit: wake the processes that read ``topics`` (best effort)."""
        ...

    def serve(self, wake: Callable[[str | None], None]) -> AbstractAsyncContextManager[None]:
        """While entered, call ``wake(topic)`` for each ring (``wake(None)``: look at every
        topic, as after a reconnection). The pub/sub enters it at its first subscription, not
        before: :meth:`ring` must work without it."""
        ...


@dataclass(eq=False)
class _Sub:
    topic: str
    group: str | None
    handler: EventHandler
    loop: LoopSubscription
    queue: WakeQueue[tuple[int, Event]] = field(default_factory=WakeQueue)
    cursor: int = 0  # fan-out: the last event id queued
    queued: int = 0  # items in the queue, or being handled
    full: bool = False  # the last fetch filled the room: more rows may be waiting
    claimed: set[int] = field(default_factory=set)  # group: claims not yet handled


class SQLPubSub(PubSubBase, LeasedPubSub):
    """A :class:`~pubsub.PubSub` (and lease provider) in a SQL database (see the module
    docstring). ``database`` and ``leases`` share one database; ``doorbell`` wakes the other
    processes. ``retention_ms``: how long events are kept (7 days); ``visibility_ms``: how long
    a group member's claim lasts without being refreshed (30 s); ``batch``: events fetched or
    claimed at once per subscription."""

    publish_before_entering = True

    def __init__(
        self, database: Database, leases: SQLLeaseProvider, doorbell: Doorbell, *,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS, poll_ms: int = 1000,
        retention_ms: int = 7 * 86_400_000, visibility_ms: int = 30_000, batch: int = 100,
    ) -> None:
        super().__init__(max_delivery_attempts=max_delivery_attempts)
        self.database = database
        self._leases = leases
        self._doorbell = doorbell
        self._ring_in: Callable[[Tx, Collection[str]], None] | None = getattr(
            doorbell, "ring_in", None)
        self._topics: dict[str, int] = {}  # topic -> subscriptions here (read by wanted())
        if hasattr(doorbell, "wanted"):
            doorbell.wanted = self._topics.__contains__
        self.poll_ms = check_int("poll_ms", poll_ms)
        self.retention_ms = check_int("retention_ms", retention_ms)
        self.visibility_ms = check_int("visibility_ms", visibility_ms, minimum=100)
        self.batch = check_int("batch", batch)
        self.consumer = uuid.uuid4().hex
        self._subs: list[_Sub] = []
        self._due: set[str | None] = set()
        self._wake_event = anyio.Event()
        self._released: list[tuple[str, str, set[int]]] = []  # closed group subs' claims
        self._ready = False
        self._listening = False  # the doorbell is served (see _listen)

    def get_lease_provider(self) -> SQLLeaseProvider:
        """The lease provider in the same database."""
        return self._leases

    @property
    def sql_database(self) -> Database:
        """The database (the signal runtime keeps its core there too)."""
        return self.database

    async def _schema(self) -> None:
        if not self._ready:
            dialect = self.database.dialect
            await self.database.ensure_schema(ps.COMPONENT, ps.VERSION, ps.ddl(dialect))
            await self.database.ensure_schema(sql_leases.COMPONENT, sql_leases.VERSION,
                                              sql_leases.ddl(dialect))
            self._ready = True

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def _lifespan(self) -> AsyncIterator[None]:
        await self._schema()
        self._listening = False
        async with owned_task_group() as tg:
            tg.start_soon(self._reader, name="sql pub/sub reader")
            yield

    async def _listen(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                      ) -> None:
        """Hear the doorbell until the pub/sub closes (from the first subscription on: a
        process that only publishes, such as a sender, hears nothing and holds no listening
        connection)."""
        async with self._doorbell.serve(self._wake):
            task_status.started()
            await anyio.sleep_forever()

    def backend_lifespan(self) -> AbstractAsyncContextManager[None]:
        return self._lifespan()

    async def aclose(self) -> None:
        """Close the database (what ``async with`` does not: it may be shared)."""
        await self.database.aclose()

    def _wake(self, topic: str | None) -> None:
        self._due.add(topic)
        self._wake_event.set()

    # -- publish ---------------------------------------------------------------------------

    async def backend_publish(self, topic: str, event: Event, wire: str) -> None:
        await self._schema()

        def publish(tx: Tx) -> None:
            ps.publish(tx, topic, wire)
            if self._ring_in is not None:
                self._ring_in(tx, (topic,))

        await self.database.run(publish, what=f"publish on {topic!r}")
        await self.announce((topic,))

    def publish_in(self, tx: Tx, topic: str, event: Event) -> None:
        """Publish ``event`` inside the caller's transaction ``tx`` on this very database:
        the event is published exactly when that transaction commits. Then call
        :meth:`announce` with its topic, so that readers (here and in other processes) look
        now rather than at their next poll. Used by the signal core in the same database to
        write a notice in the transaction that makes it true."""
        check_identifier("topic", topic)
        self._check_open(publishing=True)
        ps.publish(tx, topic, event.to_json())
        if self._ring_in is not None:
            self._ring_in(tx, (topic,))

    def notify_channel(self) -> str | None:
        """The ``NOTIFY`` channel its doorbell rings inside a transaction (Postgres), for a
        statement of the signal core that publishes a notice by SQL of its own (an event row
        in ``ps_events``, as :func:`~pubsub._backends.sql.tables.publish` writes it, and
        ``pg_notify`` on this channel with the topic); ``None`` when its doorbell does not.
        Raises as :meth:`publish` does when the pub/sub is closed."""
        self._check_open(publishing=True)
        channel = getattr(self._doorbell, "channel", None)
        return channel if isinstance(channel, str) and self._ring_in is not None else None

    async def announce(self, topics: Collection[str]) -> None:
        """Wake the readers of ``topics`` after a commit that published on them."""
        if topics:
            for topic in topics:
                if topic in self._topics:  # none read here: nothing to wake (a subscription
                    self._wake(topic)      # made later looks when it starts)
            if self._ring_in is None:
                await self._doorbell.ring(set(topics))

    # -- subscribe -------------------------------------------------------------------------

    async def backend_subscribe(
        self, topic: str, handler: EventHandler, *, group: str | None, start_from: StartFrom
    ) -> LoopSubscription:
        earliest = start_from == "earliest"
        if group is None:
            cursor = 0 if earliest else await self.database.run(ps.latest_id, write=False,
                                                                 what="subscribe")
        else:
            cursor = 0
            await self.database.run(lambda tx: ps.join_group(tx, topic, group, earliest),
                                    what=f"join of group {group!r}")
        if not self._listening:  # (once it listens, it looks at every topic: nothing missed)
            self._listening = True
            try:
                await self.task_group.start(self._listen, name="sql pub/sub doorbell")
            except BaseException:
                self._listening = False
                raise
        sub = _Sub(topic, group, handler, LoopSubscription(topic, group), cursor=cursor)
        self._subs.append(sub)
        self._topics[topic] = self._topics.get(topic, 0) + 1  # (then a look: see below)
        await self.task_group.start(self._serve, sub)
        self._wake(topic)
        return sub.loop

    async def _serve(self, sub: _Sub, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                     ) -> None:
        async def handle(item: tuple[int, Event]) -> None:
            event_id, event = item
            retry: Callable[[Event], Awaitable[None]] | None = None
            if sub.group is not None:
                async def retry(again: Event, group: str = sub.group) -> None:
                    await self.database.run(
                        lambda tx: ps.fail(tx, sub.topic, group, event_id, again.delivery_attempt),
                        what="delivery count")
            try:
                await deliver_with_retries(sub.handler, event,
                                           max_attempts=self.max_delivery_attempts,
                                           topic=sub.topic, group=sub.group, on_retry=retry)
                if sub.group is not None:
                    group = sub.group
                    with anyio.CancelScope(shield=True):
                        await self.database.run(lambda tx: ps.ack(tx, sub.topic, group,
                                                                  [event_id]), what="ack")
                    sub.claimed.discard(event_id)
            finally:
                sub.queued -= 1
                if sub.full and sub.queued < self.batch // 2:
                    self._wake(sub.topic)  # fetch what the last full batch left behind

        await sub.loop.serve(sub.queue, handle, task_status=task_status,
                             cleanup=lambda: self._forget(sub))

    def _forget(self, sub: _Sub) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            left = self._topics.pop(sub.topic, 1) - 1
            if left:
                self._topics[sub.topic] = left
        if sub.group is not None and sub.claimed:
            self._released.append((sub.topic, sub.group, set(sub.claimed)))
            self._wake_event.set()

    # -- the reader --------------------------------------------------------------------------

    async def _reader(self) -> None:
        poll = self.poll_ms / 1000
        next_poll = next_extend = loop_time()
        next_prune = loop_time() + _PRUNE_S
        while True:
            with anyio.move_on_at(next_poll):
                await self._wake_event.wait()
            self._wake_event = anyio.Event()
            now = loop_time()
            due, self._due = self._due, set()
            if now >= next_poll:
                due.add(None)
                next_poll = now + poll
            try:
                await self._release()
                for sub in list(self._subs):
                    if (None in due or sub.topic in due) and not sub.loop.closing:
                        await self._fetch(sub)
                if now >= next_extend and any(s.claimed for s in self._subs):
                    next_extend = now + self.visibility_ms / 3000
                    await self.database.run(lambda tx: ps.extend(tx, self.consumer,
                                                                 self.visibility_ms),
                                            what="claim refresh")
                if now >= next_prune:
                    next_prune = now + _PRUNE_S
                    await self.database.run(lambda tx: ps.prune(tx, self.retention_ms),
                                            what="event pruning")
            except Exception as exc:  # an outage: poll again (with the usual period)
                logger.warning("pubsub.reader_error", error=repr(exc), retry_in_s=poll)
                self._due.update(due)

    async def _fetch(self, sub: _Sub) -> None:
        room = self.batch - sub.queued
        if room <= 0:
            sub.full = True
            return
        if sub.group is None:
            rows = await self.database.run_statements(
                [(ps.EVENTS_AFTER, (sub.topic, sub.cursor, room))], write=False,
                what=f"read of {sub.topic!r}")
            items = [(int(i), body, 1) for i, body in rows]
            if rows:
                sub.cursor = int(rows[-1][0])
        else:
            group = sub.group
            items = await self.database.run(
                lambda tx: ps.claim(tx, sub.topic, group, self.consumer, room,
                                    self.visibility_ms), what=f"claim on {sub.topic!r}")
            if sub.loop.closing and items:
                # Closed while the claim ran (its cleanup may have released its claims
                # already): free these for the other members now, not after visibility_ms.
                self._released.append((sub.topic, group, {i for i, _, _ in items}))
                self._wake_event.set()
                return
            sub.claimed.update(i for i, _, _ in items)
        sub.full = len(items) >= room
        for event_id, body, attempt in items:
            try:
                event = Event.from_json(body)
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("pubsub.malformed_entry", topic=sub.topic, entry_id=event_id,
                               error=repr(exc))
                continue
            if attempt > 1:
                event = Event(event.type, event.data, event.id, event.created_at, attempt)
            sub.queued += 1
            sub.queue.put((event_id, event))

    async def _release(self) -> None:
        """Claims of closed group subscriptions not handled yet: free for the other members."""
        released, self._released = self._released, []
        rows = [(topic, group, e) for topic, group, ids in released for e in ids]
        if rows:
            await self.database.run(
                lambda tx: tx.many(
                    "UPDATE ps_claims SET until_ms = 0, attempt = attempt - 1 WHERE topic = ? "
                    "AND name = ? AND event_id = ?", rows),
                what="claim release")
