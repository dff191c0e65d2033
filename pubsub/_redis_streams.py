"""``RedisStreamsPubSub``: durable at-least-once delivery on Redis Streams (also a lease provider).

Layout: one stream per topic, ``<prefix>:topic:<topic>``, the event JSON in field ``event``.

* Named groups are real consumer groups (consumer ``<group>:<process id>``); the members of a
  group in this process share that consumer and compete locally.
* Fan-out uses one private group per process, ``fanout:<process id>``, on every topic this
  process subscribes to without a group; the process hands each entry to all its fan-out
  subscriptions on that topic and acknowledges once all of them handled it. A subscription that
  joins later gets a start position of its own (the stream's last id for ``"latest"``; for
  ``"earliest"`` an XRANGE replay up to the group's position). The private group is destroyed
  when its last subscription closes.
* XACK after success (never XDEL). Streams are bounded: approximate ``MAXLEN`` on every XADD and
  a sliding idle TTL (``PEXPIRE``) in the same MULTI.
* One reader connection per process (its own client, no retries, socket timeout above
  ``block_ms``) serves every subscription: one ``XREADGROUP`` per group name, each over all the
  streams of that group. With several group names the block time is shared between them.
* Every ``reclaim_interval_ms`` the process refreshes the idle time of the entries it holds and
  XAUTOCLAIMs entries of its named groups idle longer than ``reclaim_idle_ms`` (a dead consumer's
  pending events). The Redis delivery count tracks the attempt number (in-place retries set it
  with XCLAIM RETRYCOUNT), so the cap holds across processes.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeAlias

import anyio
import redis.asyncio
import redis.exceptions
import structlog

from leases import AcquireResult, LeaseInfo, RedisLeaseProvider

from ._contract import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    Event,
    EventHandler,
    PubSub,
    StartFrom,
    Subscription,
    check_json,
    check_subscribe_args,
    check_topic,
)
from ._delivery import EventQueue, LoopSubscription, check_max_attempts, deliver_with_retries
from ._errors import BackendUnavailableError, PubSubClosedError
from ._redis_housekeeping import FANOUT, alive_key, sweep_stream
from ._redis_support import (
    UNAVAILABLE,
    backend_errors,
    once_more_on_reconnect,
    positive_int,
    reader_client,
    require_asyncio,
    stream_id,
    text,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus
    from structlog.typing import FilteringBoundLogger

__all__ = ["RedisStreamsPubSub"]

logger: FilteringBoundLogger = structlog.get_logger("pubsub")

_FANOUT = FANOUT
_PAGE = 1000
_READ_COUNT = 32  # entries per stream per XREADGROUP
_MULTI_GROUP_CYCLE_MS = 250  # pickup latency bound with several group names

_Item: TypeAlias = tuple[str | None, Event]
"""A queued delivery: the stream entry id (``None`` for a replayed, never-acked copy), event."""


class _RedisSubscription(LoopSubscription):
    def __init__(self, owner: RedisStreamsPubSub, slot: _Slot, handler: EventHandler) -> None:
        super().__init__(slot.topic, None if slot.fanout else slot.group)
        self.handler = handler
        self.queue: EventQueue[_Item] = EventQueue()  # fan-out: each member gets its own copy
        self.after: tuple[int, int] | None = None  # fan-out: only entries with a greater id
        self._owner = owner
        self._slot = slot

    async def close(self) -> None:
        await super().close()
        with anyio.CancelScope(shield=True):
            await self._owner._detach(self)


@dataclass(eq=False)
class _Slot:
    """One (stream, group) this process reads, with its local members."""

    topic: str
    stream: str
    group: str
    consumer: str
    fanout: bool
    ready: anyio.Event = field(default_factory=anyio.Event)  # the group exists
    members: list[_RedisSubscription] = field(default_factory=list)
    queue: EventQueue[_Item] = field(default_factory=EventQueue)  # competing members share it
    refs: dict[str, int] = field(default_factory=dict)  # fan-out: entry id -> handlers left
    inflight: set[str] = field(default_factory=set)  # entry ids queued or being handled
    last_id: str | None = None  # the group's position as far as this process knows
    throttled: bool = False  # skipped by the reader: enough is queued here

    def wants_read(self) -> bool:
        """Read more only while the local backlog is short, so one process never hoards a
        group's entries (they would sit pending here while other consumers are idle)."""
        if self.fanout:
            return max((len(m.queue) for m in self.members), default=0) < _READ_COUNT
        return len(self.queue) < max(1, len(self.members))


class RedisStreamsPubSub(PubSub):
    """A :class:`PubSub` on Redis Streams, and a ``LeaseProvider`` on the same connection.

    Give exactly one of ``url`` or ``client`` (only a client built from ``url`` is closed).
    ``publish`` works without entering (a plain XADD); ``subscribe`` needs ``async with``.
    Unreachable Redis raises :class:`BackendUnavailableError`; under trio,
    :class:`UnsupportedBackendError`. ``max_stream_length=0`` / ``stream_idle_ttl_ms=0``
    disable the bounds.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | None = None,
        key_prefix: str = "pubsub",
        max_stream_length: int = 10_000,
        stream_idle_ttl_ms: int = 7 * 86_400_000,
        block_ms: int = 1000,
        reclaim_idle_ms: int = 30_000,
        reclaim_interval_ms: int | None = None,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        consumer_name: str | None = None,
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("RedisStreamsPubSub needs exactly one of url= or client=")
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ValueError("key_prefix must be a non-empty string")
        if consumer_name is not None and (
            not isinstance(consumer_name, str) or not consumer_name or ":" in consumer_name
        ):
            raise ValueError("consumer_name must be a non-empty string without ':', or None")
        self.max_stream_length = positive_int("max_stream_length", max_stream_length, zero_ok=True)
        self.stream_idle_ttl_ms = positive_int(
            "stream_idle_ttl_ms", stream_idle_ttl_ms, zero_ok=True
        )
        self.block_ms = positive_int("block_ms", block_ms)
        self.reclaim_idle_ms = positive_int("reclaim_idle_ms", reclaim_idle_ms)
        if reclaim_interval_ms is None:
            reclaim_interval_ms = max(1, reclaim_idle_ms // 2)
        self.reclaim_interval_ms = positive_int("reclaim_interval_ms", reclaim_interval_ms)
        self.max_delivery_attempts = check_max_attempts(max_delivery_attempts)
        self._owns_client = client is None
        if client is None:
            assert url is not None
            client = redis.asyncio.Redis.from_url(url)
        self._client: redis.asyncio.Redis = client
        self._prefix = key_prefix
        self.process_id = consumer_name or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._leases = RedisLeaseProvider(client=self._client, key_prefix=f"{key_prefix}:lease")
        self._reader: redis.asyncio.Redis | None = None
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._tg: TaskGroup | None = None
        self._loop_scopes: list[anyio.CancelScope] = []
        self._closed = False
        self._wakeup: anyio.Event | None = None
        self._reader_id: int | None = None  # CLIENT ID of the reader connection
        self._reader_blocked = False
        self._alive_key = alive_key(key_prefix, self.process_id)
        self._alive_ttl_ms = 10 * self.reclaim_idle_ms
        self._log = logger.bind(consumer=self.process_id)

    # -- properties ------------------------------------------------------------------------

    @property
    def redis_client(self) -> redis.asyncio.Redis:
        """The client for publishing and leases (the signals runtime puts its inbox on it)."""
        return self._client

    @property
    def key_prefix(self) -> str:
        """The prefix of every key this pub/sub writes."""
        return self._prefix

    def stream_key(self, topic: str) -> str:
        """The Redis key of ``topic``'s stream."""
        return f"{self._prefix}:topic:{check_topic(topic)}"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        require_asyncio()
        if self._tg is not None or self._closed:
            raise PubSubClosedError("a RedisStreamsPubSub can be entered once")
        self._reader = reader_client(
            self._client, block_ms=self.block_ms, name=f"{self._prefix}:reader:{self.process_id}"
        )
        try:
            with backend_errors("connect"):
                await self._beat()
        except BaseException:
            await self._release_clients()
            raise
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            await tg.start(self._background, self._read_loop, name="pubsub redis reader")
            await tg.start(self._background, self._reclaim_loop, name="pubsub redis reclaim")
        except BaseException as exc:
            tg.cancel_scope.cancel()
            self._tg = None
            try:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            finally:
                await self._release_clients()
            raise
        return self

    async def _background(
        self, loop: Any, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.CancelScope() as scope:
            self._loop_scopes.append(scope)
            task_status.started()
            await loop()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg = self._tg
        self._closed = True
        try:
            if tg is not None:
                try:
                    if exc_type is None:
                        await self.close()  # graceful: in-flight handlers finish
                finally:
                    tg.cancel_scope.cancel()
                    self._tg = None
                    await tg.__aexit__(None, None, None)  # the body's error propagates as is
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                for slot in list(self._slots.values()):
                    if slot.fanout:
                        await self._destroy_group(slot)
                self._slots.clear()
            await self._release_clients()

    async def _beat(self) -> None:
        """Refresh this process's liveness key (see ``_redis_housekeeping``)."""
        await self._client.set(self._alive_key, "1", px=self._alive_ttl_ms)

    async def _release_clients(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            if self._reader is not None:
                try:
                    await self._client.delete(self._alive_key)
                except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                    self._log.debug("pubsub.heartbeat_failed", error=repr(exc))
                reader, self._reader = self._reader, None
                await reader.aclose()
            if self._owns_client:
                await self._client.aclose()

    async def close(self) -> None:
        """Close every subscription (in-flight handlers finish first, private fan-out groups
        are destroyed) and stop the reader; connections are released when ``async with``
        exits."""
        self._closed = True
        for slot in list(self._slots.values()):
            for sub in list(slot.members):
                await sub.close()
        for scope in self._loop_scopes:
            scope.cancel()

    def _require_open(self) -> TaskGroup:
        if self._closed:
            raise PubSubClosedError("this RedisStreamsPubSub is closed")
        if self._tg is None:
            raise PubSubClosedError(
                "enter the pub/sub first: `async with RedisStreamsPubSub(...) as pubsub`"
            )
        return self._tg

    # -- publish ---------------------------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> str:
        check_topic(topic)
        if not isinstance(event, Event):
            raise TypeError(f"publish takes a pubsub.Event, got {type(event).__name__}")
        check_json(event.data)  # the data may have been mutated since the Event was built
        require_asyncio()
        if self._closed:
            raise PubSubClosedError("this RedisStreamsPubSub is closed")
        stream = self.stream_key(topic)
        payload = event.to_json()

        async def xadd() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xadd(
                    stream,
                    {"event": payload},
                    maxlen=self.max_stream_length or None,
                    approximate=True,
                )
                if self.stream_idle_ttl_ms:
                    pipe.pexpire(stream, self.stream_idle_ttl_ms)
                await pipe.execute()

        with backend_errors(f"publish to {topic!r}"):
            await once_more_on_reconnect(xadd)
        return event.id

    # -- subscribe -------------------------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        handler: EventHandler,
        *,
        group: str | None = None,
        start_from: StartFrom = "latest",
    ) -> Subscription:
        check_subscribe_args(topic, handler, group, start_from)
        if group is not None and group.startswith(_FANOUT + ":"):
            raise ValueError(f"group names starting with {_FANOUT!r}: are reserved")
        tg = self._require_open()
        slot, fresh = await self._slot(topic, group, start_from)
        sub = _RedisSubscription(self, slot, handler)
        slot.members.append(sub)  # from here on the reader hands entries to it
        try:
            if slot.fanout and not fresh:
                await self._position(slot, sub, start_from)
            await tg.start(self._serve, sub)
        except BaseException:
            sub.abandon()
            with anyio.CancelScope(shield=True):
                await self._detach(sub)
            raise
        if fresh and not slot.fanout:
            await self._read_own_pending(slot)
        if fresh:
            await self._interrupt_reader()  # read the new stream now, not after a block
        return sub

    async def _slot(
        self, topic: str, group: str | None, start_from: StartFrom
    ) -> tuple[_Slot, bool]:
        """The slot of (topic, group), creating the Redis group if needed; ``True`` if new."""
        fanout = group is None
        group_name = f"{_FANOUT}:{self.process_id}" if fanout else str(group)
        key = (topic, group_name)
        while True:
            slot = self._slots.get(key)
            if slot is None:
                break
            await slot.ready.wait()
            if self._slots.get(key) is slot:  # not dropped after a failed creation
                return slot, False
        slot = _Slot(
            topic=topic,
            stream=self.stream_key(topic),
            group=group_name,
            consumer=self.process_id if fanout else f"{group_name}:{self.process_id}",
            fanout=fanout,
        )
        self._slots[key] = slot
        try:
            with backend_errors(f"subscribe to {topic!r}"):
                await self._create_group(slot, "0" if start_from == "earliest" else "$")
        except BaseException:
            if self._slots.get(key) is slot:
                del self._slots[key]
            raise
        finally:
            slot.ready.set()
        return slot, True

    async def _position(
        self, slot: _Slot, sub: _RedisSubscription, start_from: StartFrom
    ) -> None:
        """Give a fan-out member joining a live slot its own start: entries up to ``cut`` are
        not its business (``"latest"``) or come from an XRANGE replay (``"earliest"``)."""
        backlog: list[Event] = []
        with backend_errors(f"subscribe to {slot.topic!r}"):
            if start_from == "latest":
                last: Any = await self._client.xrevrange(slot.stream, "+", "-", count=1)
                cut = stream_id(last[0][0]) if last else (0, 0)
            else:
                cut = await self._group_position(slot)
                backlog = await self._replay(slot, cut)
        to_ack: list[str] = []
        kept: list[_Item] = []
        for entry_id, event in sub.queue.drain():  # handed over before the cut was known
            if entry_id is not None and stream_id(entry_id) <= cut:
                if self._release(slot, entry_id):
                    to_ack.append(entry_id)
            else:
                kept.append((entry_id, event))
        sub.after = cut
        for event in backlog:
            sub.queue.put((None, event))
        for item in kept:
            sub.queue.put(item)
        await self._ack(slot, to_ack)

    async def _group_position(self, slot: _Slot) -> tuple[int, int]:
        try:
            groups: Any = await self._client.xinfo_groups(slot.stream)
        except redis.exceptions.ResponseError:  # the stream vanished: nothing to replay
            return (0, 0)
        for info in groups:
            if text(info.get("name")) == slot.group:
                return stream_id(info.get("last-delivered-id") or "0-0")
        return (0, 0)

    async def _replay(self, slot: _Slot, cut: tuple[int, int]) -> list[Event]:
        events: list[Event] = []
        if cut == (0, 0):
            return events
        start, end = "-", f"{cut[0]}-{cut[1]}"
        while True:
            rows: Any = await self._client.xrange(slot.stream, start, end, count=_PAGE)
            for entry_id, fields in rows:
                event = self._parse(slot, text(entry_id), fields)
                if event is not None:
                    events.append(event)
            if len(rows) < _PAGE:
                return events
            start = "(" + text(rows[-1][0])

    async def _read_own_pending(self, slot: _Slot) -> None:
        """Take back what this consumer had been handed but not acknowledged (an earlier
        subscription of this process, or a reply lost in a reconnect)."""
        start = "0"
        while True:
            with backend_errors(f"subscribe to {slot.topic!r}"):
                reply: Any = await self._client.xreadgroup(
                    slot.group, slot.consumer, {slot.stream: start}, count=_PAGE
                )
            entries = reply[0][1] if reply else []
            counts = await self._delivery_counts(slot, [text(i) for i, _ in entries])
            to_ack = [
                text(entry_id)
                for entry_id, fields in entries
                if fields
                and self._dispatch(slot, text(entry_id), fields, counts.get(text(entry_id), 2))
            ]
            await self._ack(slot, to_ack)
            if len(entries) < _PAGE:
                return
            start = text(entries[-1][0])

    async def _create_group(self, slot: _Slot, start_id: str) -> None:
        """XGROUP CREATE with MKSTREAM (an existing group keeps its position). Created at
        ``$``, the position is read in the same MULTI, so a re-creation resumes exactly there."""

        async def create() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xgroup_create(slot.stream, slot.group, id=start_id, mkstream=True)
                if self.stream_idle_ttl_ms:
                    pipe.pexpire(slot.stream, self.stream_idle_ttl_ms)
                pipe.xinfo_stream(slot.stream)
                results = await pipe.execute(raise_on_error=False)
            if isinstance(results[0], Exception):
                if "BUSYGROUP" not in str(results[0]):
                    raise results[0]
            elif start_id == "$" and isinstance(results[-1], dict) and slot.last_id is None:
                slot.last_id = text(results[-1]["last-generated-id"])

        await once_more_on_reconnect(create)

    async def _destroy_group(self, slot: _Slot) -> None:
        try:
            await self._client.xgroup_destroy(slot.stream, slot.group)
        except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
            self._log.debug("pubsub.group_destroy_failed", topic=slot.topic, error=repr(exc))

    async def _detach(self, sub: _RedisSubscription) -> None:
        slot = sub._slot
        if sub not in slot.members:
            return
        slot.members.remove(sub)
        if slot.fanout:  # what this member will not handle no longer holds up the ack
            to_ack = [
                entry_id
                for entry_id, _event in sub.queue.drain()
                if entry_id is not None and self._release(slot, entry_id)
            ]
            with anyio.move_on_after(5):
                await self._ack(slot, to_ack)
        if not slot.members and self._slots.get((slot.topic, slot.group)) is slot:
            # A named group's queued entries stay pending in Redis for a later subscription.
            del self._slots[(slot.topic, slot.group)]
            if slot.fanout:
                with anyio.move_on_after(2):
                    await self._destroy_group(slot)

    # -- delivery --------------------------------------------------------------------------

    async def _serve(
        self, sub: _RedisSubscription, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        slot = sub._slot
        queue = sub.queue if slot.fanout else slot.queue

        async def handle(item: _Item) -> None:
            await self._handle(slot, sub, item)

        await sub.serve(queue, handle, task_status=task_status)

    async def _handle(self, slot: _Slot, sub: _RedisSubscription, item: _Item) -> None:
        entry_id, event = item

        async def note_retry(retry: Event) -> None:
            # Keep Redis's delivery count equal to the attempt number, so that a process that
            # takes the entry over after a crash continues the count instead of restarting it.
            if entry_id is None or slot.fanout:
                return
            try:
                with anyio.move_on_after(5):
                    await self._client.xclaim(
                        slot.stream, slot.group, slot.consumer, 0, [entry_id],
                        retrycount=retry.delivery_attempt, justid=True,
                    )
            except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                self._log.debug("pubsub.retry_count_failed", entry_id=entry_id, error=repr(exc))

        await deliver_with_retries(
            sub.handler,
            event,
            max_attempts=self.max_delivery_attempts,
            topic=slot.topic,
            group=sub.group,
            on_retry=note_retry,
        )
        if entry_id is not None and self._release(slot, entry_id):
            await self._ack(slot, [entry_id])
        if slot.throttled and slot.wants_read():
            slot.throttled = False
            await self._interrupt_reader()

    def _release(self, slot: _Slot, entry_id: str) -> bool:
        """One holder is done with ``entry_id``; ``True`` when it is time to XACK it."""
        if slot.fanout:
            left = slot.refs.get(entry_id, 1) - 1
            if left > 0:
                slot.refs[entry_id] = left
                return False
            slot.refs.pop(entry_id, None)
        slot.inflight.discard(entry_id)
        return True

    async def _ack(self, slot: _Slot, entry_ids: list[str]) -> None:
        if not entry_ids:
            return
        try:
            with anyio.move_on_after(5):
                await self._client.xack(slot.stream, slot.group, *entry_ids)
        except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
            # Not acknowledged: the entries stay pending and come again (at least once).
            self._log.warning(
                "pubsub.ack_failed", topic=slot.topic, entry_ids=entry_ids, error=repr(exc)
            )

    def _parse(self, slot: _Slot, entry_id: str, fields: dict[Any, Any]) -> Event | None:
        raw = fields.get(b"event", fields.get("event"))
        try:
            if raw is None:
                raise KeyError("no 'event' field")
            return Event.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            self._log.warning(
                "pubsub.malformed_entry", topic=slot.topic, entry_id=entry_id, error=repr(exc)
            )
            return None

    def _dispatch(self, slot: _Slot, entry_id: str, fields: dict[Any, Any], attempt: int) -> bool:
        """Queue an entry read from Redis for the slot's members; ``True``: XACK it now."""
        if not slot.members or self._slots.get((slot.topic, slot.group)) is not slot:
            return False  # the subscription closed meanwhile: the entry stays pending
        if entry_id in slot.inflight:
            return False  # already queued here (a pending re-read raced the reader)
        event = self._parse(slot, entry_id, fields)
        if event is None:
            return True  # never deliverable
        if attempt > self.max_delivery_attempts:  # e.g. it crashed every process it reached
            self._log.warning(
                "pubsub.event_dropped",
                topic=slot.topic,
                group=None if slot.fanout else slot.group,
                event_id=event.id,
                attempts=attempt - 1,
            )
            return True
        if attempt > event.delivery_attempt:
            event = Event(event.type, event.data, event.id, event.created_at, attempt)
        if slot.fanout:
            sid = stream_id(entry_id)
            members = [
                m
                for m in slot.members
                if not m.closing and (m.after is None or sid > m.after)
            ]
            if not members:
                return True
            slot.refs[entry_id] = len(members)
            slot.inflight.add(entry_id)
            for member in members:
                member.queue.put((entry_id, event))
        else:
            slot.inflight.add(entry_id)
            slot.queue.put((entry_id, event))
        return False

    async def _interrupt_reader(self) -> None:
        """Make the reader rebuild its read set now: wake it when idle, and end a blocking
        XREADGROUP early with CLIENT UNBLOCK (it then returns as if timed out)."""
        if self._wakeup is not None:
            self._wakeup.set()
        reader_id = self._reader_id
        if self._reader_blocked and reader_id is not None:
            try:
                await self._client.client_unblock(reader_id)
            except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                self._log.debug("pubsub.unblock_failed", error=repr(exc))

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        backoff = 0.1
        while True:
            by_group: dict[str, list[_Slot]] = {}
            for slot in self._slots.values():
                if not slot.members or not slot.ready.is_set():
                    continue
                if not slot.wants_read():
                    slot.throttled = True  # _handle interrupts the reader once it drains
                    continue
                by_group.setdefault(slot.group, []).append(slot)
            if not by_group:
                self._wakeup = anyio.Event()
                with anyio.move_on_after(self.block_ms / 1000):
                    await self._wakeup.wait()
                self._wakeup = None
                continue
            if len(by_group) == 1:
                block = self.block_ms
            else:  # XREADGROUP waits on one group: cycle through them with short blocks
                block = max(1, min(self.block_ms, _MULTI_GROUP_CYCLE_MS) // len(by_group))
            try:
                if self._reader_id is None:
                    self._reader_id = int(await reader.client_id())
                for group, slots in by_group.items():
                    streams: Any = {s.stream: ">" for s in slots}
                    self._reader_blocked = True
                    try:
                        reply: Any = await reader.xreadgroup(
                            group, slots[0].consumer, streams, count=_READ_COUNT, block=block
                        )
                    finally:
                        self._reader_blocked = False
                    for stream_name, entries in reply or []:
                        slot = next(s for s in slots if s.stream == text(stream_name))
                        if entries:
                            newest = text(entries[-1][0])
                            if slot.last_id is None or stream_id(newest) > stream_id(slot.last_id):
                                slot.last_id = newest
                        to_ack = [
                            text(entry_id)
                            for entry_id, fields in entries
                            if fields and self._dispatch(slot, text(entry_id), fields, 1)
                        ]
                        await self._ack(slot, to_ack)
                backoff = 0.1
            except redis.exceptions.ResponseError as exc:
                # NOGROUP: the stream expired or Redis lost it; UNBLOCKED: it was deleted (or
                # expired) while the read was blocked on it. Either way: recreate and go on.
                if "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc):
                    for slots in by_group.values():
                        for slot in slots:
                            await self._recreate(slot)
                else:
                    self._log.warning("pubsub.reader_error", error=repr(exc), retry_in_s=backoff)
                    await anyio.sleep(backoff)
            except UNAVAILABLE as exc:
                self._reader_id = None  # a new connection has a new id
                self._log.warning("pubsub.reader_error", error=repr(exc), retry_in_s=backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _recreate(self, slot: _Slot) -> None:
        try:
            with backend_errors(f"recreate group of {slot.topic!r}"):
                await self._create_group(slot, slot.last_id or "0")
        except (BackendUnavailableError, redis.exceptions.ResponseError) as exc:
            self._log.warning("pubsub.reader_error", error=repr(exc))

    # -- reclaim ---------------------------------------------------------------------------

    async def _reclaim_loop(self) -> None:
        """Upkeep. Every pass (at most a third of ``reclaim_idle_ms`` apart, so held entries
        never look idle): liveness key, refresh held entries. Every ``reclaim_interval_ms``:
        XAUTOCLAIM. Every ``reclaim_idle_ms``: sweep dead processes' leftovers."""
        period = min(self.reclaim_interval_ms, max(1, self.reclaim_idle_ms // 3)) / 1000
        last_reclaim = last_sweep = anyio.current_time()
        while True:
            await anyio.sleep(period)
            now = anyio.current_time()
            reclaim = now - last_reclaim >= self.reclaim_interval_ms / 1000 - 1e-3
            sweep = now - last_sweep >= self.reclaim_idle_ms / 1000 - 1e-3
            try:
                await self._beat()
            except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                self._log.warning("pubsub.heartbeat_failed", error=repr(exc))
            for slot in list(self._slots.values()):
                if slot.fanout or not slot.members or not slot.ready.is_set():
                    continue
                try:
                    await self._refresh_held(slot)
                    if reclaim:
                        await self._reclaim(slot)
                except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                    self._log.warning("pubsub.reclaim_failed", topic=slot.topic, error=repr(exc))
            if reclaim:
                last_reclaim = now
            if sweep:
                last_sweep = now
                await self._sweep()

    async def _sweep(self) -> None:
        streams: dict[str, set[str]] = {}
        for slot in list(self._slots.values()):
            names = streams.setdefault(slot.stream, set())
            if not slot.fanout:
                names.add(slot.group)
        for stream, own_groups in streams.items():
            try:
                await sweep_stream(
                    self._client, prefix=self._prefix, stream=stream, own_groups=own_groups,
                    process_id=self.process_id, log=self._log,
                )
            except (*UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                self._log.debug("pubsub.sweep_failed", stream=stream, error=repr(exc))

    async def _refresh_held(self, slot: _Slot) -> None:
        """Reset the idle time of entries this process holds (queued or being handled), so a
        live process's slow handler is not mistaken for a dead consumer's."""
        if not slot.inflight:
            return
        rows: Any = await self._client.xpending_range(
            slot.stream, slot.group, "-", "+", count=len(slot.inflight) + _PAGE,
            consumername=slot.consumer,
        )
        held: list[Any] = [
            text(r["message_id"]) for r in rows if text(r["message_id"]) in slot.inflight
        ]
        if held:
            await self._client.xclaim(
                slot.stream, slot.group, slot.consumer, 0, held, justid=True
            )

    async def _delivery_counts(self, slot: _Slot, entry_ids: list[str]) -> dict[str, int]:
        if not entry_ids:
            return {}
        rows: Any = await self._client.xpending_range(
            slot.stream, slot.group, min=entry_ids[0], max=entry_ids[-1],
            count=len(entry_ids) + _PAGE,
        )
        return {text(r["message_id"]): int(r["times_delivered"]) for r in rows}

    async def _reclaim(self, slot: _Slot) -> None:
        cursor = "0-0"
        while True:
            reply: Any = await self._client.xautoclaim(
                slot.stream, slot.group, slot.consumer, self.reclaim_idle_ms,
                start_id=cursor, count=100,
            )
            cursor = text(reply[0])
            deleted = [text(d) for d in (reply[2] if len(reply) > 2 else [])]
            await self._ack(slot, deleted)  # trimmed away while pending: nothing to deliver
            fresh = [(text(i), f) for i, f in reply[1] if f and text(i) not in slot.inflight]
            counts = await self._delivery_counts(slot, [i for i, _ in fresh])
            to_ack = []
            for entry_id, fields in fresh:
                self._log.info("pubsub.reclaimed", topic=slot.topic, entry_id=entry_id)
                if self._dispatch(slot, entry_id, fields, counts.get(entry_id, 2)):
                    to_ack.append(entry_id)
            await self._ack(slot, to_ack)
            if cursor == "0-0":
                return

    # -- LeaseProvider (delegated to RedisLeaseProvider on the same client) -----------------

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        """See :class:`leases.LeaseProvider`."""
        return await self._leases.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        """See :class:`leases.LeaseProvider`."""
        return await self._leases.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        """See :class:`leases.LeaseProvider`."""
        await self._leases.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """See :class:`leases.LeaseProvider`."""
        return await self._leases.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        """See :class:`leases.LeaseProvider`."""
        return await self._leases.transfer_lease(key, from_owner, to_owner, ttl_ms)

    async def lease_info(self, key: str) -> LeaseInfo | None:
        """Owner, TTL left and token of ``key``'s lease (``None`` when free)."""
        return await self._leases.lease_info(key)
