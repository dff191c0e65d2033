"""``RedisStreamsPubSub``: durable at-least-once delivery on Redis Streams (also a lease provider).

Layout: one stream per topic, ``<prefix>:topic:<topic>``, the event JSON in field ``event``.

* Named groups are real consumer groups (consumer ``<group>:<process id>``); the members of a
  group in this process share that consumer and compete locally.
* Fan-out uses one private group per process, ``fanout:<process id>``, on every topic this
  process subscribes to without a group; the process hands each entry to all its fan-out
  subscriptions on that topic and acknowledges once all of them handled it. The private group
  is destroyed when its last subscription closes.
* XACK after success (never XDEL). Streams are bounded: approximate ``MAXLEN`` on every XADD and
  a sliding idle TTL (``PEXPIRE``) in the same MULTI.
* One reader connection per process (its own client, no retries, socket timeout above
  ``block_ms``) serves every subscription: one ``XREADGROUP`` per group name, each over all the
  streams of that group. With several group names the block time is shared between them.
* Every ``reclaim_interval_ms`` the process XAUTOCLAIMs entries of its named groups idle longer
  than ``reclaim_idle_ms`` (a dead consumer's pending events) and handles them; the Redis
  delivery count carries the attempt number across processes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import redis.asyncio
import redis.exceptions
import sniffio
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from leases import AcquireResult, LeaseInfo, RedisLeaseProvider

from ._contract import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    Event,
    EventHandler,
    PubSub,
    StartFrom,
    Subscription,
    check_topic,
)
from ._delivery import EventQueue, check_max_attempts, deliver_with_retries
from ._errors import BackendUnavailableError, PubSubClosedError, UnsupportedBackendError

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from structlog.typing import FilteringBoundLogger

__all__ = ["RedisStreamsPubSub"]

logger: FilteringBoundLogger = structlog.get_logger("pubsub")

_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
_FANOUT = "fanout"


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _positive(name: str, value: object, *, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or (value == 0 and not zero_ok):
        bound = "non-negative" if zero_ok else "positive"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _require_asyncio() -> None:
    try:
        library: str | None = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library != "asyncio":
        raise UnsupportedBackendError(
            "RedisStreamsPubSub needs asyncio (redis-py is asyncio-only), running under "
            f"{library or 'no async library'}; use InMemoryPubSub or run on asyncio"
        )


@contextmanager
def _backend_errors(operation: str) -> Iterator[None]:
    try:
        yield
    except _UNAVAILABLE as exc:
        raise BackendUnavailableError(f"Redis unavailable during {operation}: {exc}") from exc


async def _once_more_on_reconnect(operation: Callable[[], Awaitable[None]]) -> None:
    """Run ``operation``; after a restart of Redis the first use of a pooled connection fails
    with ``ConnectionError``, so try once more on a fresh one. (A replayed XADD can duplicate an
    event: delivery is at least once, and the event id stays the same.)"""
    try:
        await operation()
    except redis.exceptions.ConnectionError:
        await operation()


class _RedisSubscription(Subscription):
    def __init__(self, owner: RedisStreamsPubSub, slot: _Slot, handler: EventHandler) -> None:
        self.topic = slot.topic
        self.group = None if slot.fanout else slot.group
        self.handler = handler
        self.queue = EventQueue()  # fan-out members get their own copy of each event
        self._owner = owner
        self._slot = slot
        self._scope: anyio.CancelScope | None = None
        self._busy = False
        self._closing = False
        self._done = anyio.Event()

    async def close(self) -> None:
        if not self._closing:
            self._closing = True
            if not self._busy and self._scope is not None:
                self._scope.cancel()
        await self._done.wait()
        await self._owner._detach(self)


@dataclass(eq=False)
class _Slot:
    """One (stream, group) this process reads, with its local members."""

    topic: str
    stream: str
    group: str
    consumer: str
    fanout: bool
    members: list[_RedisSubscription] = field(default_factory=list)
    queue: EventQueue = field(default_factory=EventQueue)  # competing members share it
    refs: dict[str, int] = field(default_factory=dict)  # fan-out: entry id -> handlers left
    entry_of: dict[str, str] = field(default_factory=dict)  # event id -> entry id
    inflight: set[str] = field(default_factory=set)


class RedisStreamsPubSub(PubSub):
    """A :class:`PubSub` on Redis Streams, and a ``LeaseProvider`` on the same connection.

    Give exactly one of ``url`` or ``client`` (only a client built from ``url`` is closed).
    ``publish`` works without entering; ``subscribe`` needs ``async with``. Unreachable Redis
    raises :class:`BackendUnavailableError`; under trio, :class:`UnsupportedBackendError`.
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
        self.max_stream_length = _positive("max_stream_length", max_stream_length, zero_ok=True)
        self.stream_idle_ttl_ms = _positive("stream_idle_ttl_ms", stream_idle_ttl_ms, zero_ok=True)
        self.block_ms = _positive("block_ms", block_ms)
        self.reclaim_idle_ms = _positive("reclaim_idle_ms", reclaim_idle_ms)
        if reclaim_interval_ms is None:
            reclaim_interval_ms = max(1, reclaim_idle_ms // 2)
        self.reclaim_interval_ms = _positive("reclaim_interval_ms", reclaim_interval_ms)
        self.max_delivery_attempts = check_max_attempts(max_delivery_attempts)
        self._owns_client = client is None
        self._client: redis.asyncio.Redis = (
            client if client is not None else redis.asyncio.Redis.from_url(url)  # type: ignore[arg-type]
        )
        self._prefix = key_prefix
        self.process_id = consumer_name or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._leases = RedisLeaseProvider(client=self._client, key_prefix=f"{key_prefix}:lease")
        self._reader: redis.asyncio.Redis | None = None
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._tg: TaskGroup | None = None
        self._closed = False
        self._wakeup: anyio.Event | None = None
        self._log = logger.bind(consumer=self.process_id)

    # -- properties ------------------------------------------------------------------------

    @property
    def redis_client(self) -> redis.asyncio.Redis:
        """The client for publishing and leases (the signals runtime puts its inbox on it)."""
        return self._client

    @property
    def key_prefix(self) -> str:
        return self._prefix

    def stream_key(self, topic: str) -> str:
        """The Redis key of ``topic``'s stream."""
        return f"{self._prefix}:topic:{topic}"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        _require_asyncio()
        if self._tg is not None or self._closed:
            raise PubSubClosedError("a RedisStreamsPubSub can be entered once")
        kwargs = dict(self._client.connection_pool.connection_kwargs)
        kwargs["socket_timeout"] = self.block_ms / 1000 + 5
        kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs.pop("retry_on_timeout", None)
        kwargs["client_name"] = f"{self._prefix}:reader:{self.process_id}"
        pool = redis.asyncio.ConnectionPool(
            connection_class=self._client.connection_pool.connection_class,
            max_connections=2,
            **kwargs,
        )
        self._reader = redis.asyncio.Redis.from_pool(pool)
        with _backend_errors("connect"):
            await self._client.ping()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._read_loop, name="pubsub redis reader")
        tg.start_soon(self._reclaim_loop, name="pubsub redis reclaim")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg, self._tg = self._tg, None
        self._closed = True
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(exc_type, exc, tb)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                for slot in list(self._slots.values()):
                    if slot.fanout:
                        await self._destroy_group(slot)
                self._slots.clear()
                if self._reader is not None:
                    await self._reader.aclose()
                if self._owns_client:
                    await self._client.aclose()

    async def close(self) -> None:
        """Stop delivery; resources are released when the ``async with`` block exits."""
        self._closed = True
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

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
        _require_asyncio()
        if self._closed:
            raise PubSubClosedError("this RedisStreamsPubSub is closed")
        stream = self.stream_key(topic)
        payload = event.to_json()

        async def xadd() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xadd(
                    stream, {"event": payload}, maxlen=self.max_stream_length or None,
                    approximate=True,
                )
                if self.stream_idle_ttl_ms:
                    pipe.pexpire(stream, self.stream_idle_ttl_ms)
                await pipe.execute()

        with _backend_errors(f"publish to {topic!r}"):
            await _once_more_on_reconnect(xadd)
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
        check_topic(topic)
        if not callable(handler):
            raise TypeError("handler must be an async callable taking an Event")
        if group is not None and (not isinstance(group, str) or not group):
            raise ValueError("group must be a non-empty string or None")
        if group is not None and group.startswith(_FANOUT + ":"):
            raise ValueError(f"group names starting with {_FANOUT!r}: are reserved")
        if start_from not in ("latest", "earliest"):
            raise ValueError(f"start_from must be 'latest' or 'earliest', got {start_from!r}")
        tg = self._require_open()
        fanout = group is None
        group_name = f"{_FANOUT}:{self.process_id}" if fanout else str(group)
        key = (topic, group_name)
        slot = self._slots.get(key)
        if slot is None:
            stream = self.stream_key(topic)
            slot = _Slot(
                topic=topic,
                stream=stream,
                group=group_name,
                consumer=f"{group_name}:{self.process_id}" if not fanout else self.process_id,
                fanout=fanout,
            )
            await self._create_group(slot, "0" if start_from == "earliest" else "$")
            self._slots[key] = slot
        sub = _RedisSubscription(self, slot, handler)
        fresh_slot = not slot.members
        slot.members.append(sub)
        await tg.start(self._serve, sub)
        if fresh_slot and not fanout:
            await self._read_own_pending(slot)
        self._kick()
        return sub

    async def _read_own_pending(self, slot: _Slot) -> None:
        """Take back what this consumer had been handed but not acknowledged (an earlier
        subscription of this process, or a reply lost in a reconnect)."""
        with _backend_errors(f"subscribe to {slot.topic!r}"):
            reply: Any = await self._client.xreadgroup(
                slot.group, slot.consumer, {slot.stream: "0"}, count=1000
            )
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                eid = _text(entry_id)
                if fields and eid not in slot.inflight:
                    self._dispatch(slot, eid, fields, 2)

    async def _create_group(self, slot: _Slot, start_id: str) -> None:
        async def create() -> None:
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.xgroup_create(slot.stream, slot.group, id=start_id, mkstream=True)
                    if self.stream_idle_ttl_ms:
                        pipe.pexpire(slot.stream, self.stream_idle_ttl_ms)
                    await pipe.execute()
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        with _backend_errors(f"subscribe to {slot.topic!r}"):
            await _once_more_on_reconnect(create)

    async def _destroy_group(self, slot: _Slot) -> None:
        try:
            await self._client.xgroup_destroy(slot.stream, slot.group)
        except (*_UNAVAILABLE, redis.exceptions.ResponseError) as exc:
            self._log.debug("pubsub.group_destroy_failed", topic=slot.topic, error=repr(exc))

    async def _detach(self, sub: _RedisSubscription) -> None:
        slot = sub._slot
        if sub in slot.members:
            slot.members.remove(sub)
        if not slot.members and self._slots.get((slot.topic, slot.group)) is slot:
            del self._slots[(slot.topic, slot.group)]
            if slot.fanout:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await self._destroy_group(slot)

    # -- delivery --------------------------------------------------------------------------

    async def _serve(
        self, sub: _RedisSubscription, *, task_status: Any = anyio.TASK_STATUS_IGNORED
    ) -> None:
        slot = sub._slot
        queue = sub.queue if slot.fanout else slot.queue
        try:
            with anyio.CancelScope() as scope:
                sub._scope = scope
                task_status.started()
                while not sub._closing:
                    event = await queue.get()
                    sub._busy = True
                    try:
                        await self._handle(slot, sub, event)
                    finally:
                        sub._busy = False
        finally:
            sub._done.set()

    async def _handle(self, slot: _Slot, sub: _RedisSubscription, event: Event) -> None:
        await deliver_with_retries(
            sub.handler,
            event,
            max_attempts=self.max_delivery_attempts,
            topic=slot.topic,
            group=sub.group,
        )
        entry_id = slot.entry_of.get(event.id)
        if entry_id is None:
            return
        if slot.fanout:
            left = slot.refs.get(entry_id, 1) - 1
            if left > 0:
                slot.refs[entry_id] = left
                return
            slot.refs.pop(entry_id, None)
        slot.entry_of.pop(event.id, None)
        slot.inflight.discard(entry_id)
        try:
            with anyio.move_on_after(5):
                await self._client.xack(slot.stream, slot.group, entry_id)
        except _UNAVAILABLE as exc:
            # Not acknowledged: the entry stays pending and is redelivered (at least once).
            self._log.warning("pubsub.ack_failed", topic=slot.topic, entry_id=entry_id,
                              error=repr(exc))

    def _dispatch(self, slot: _Slot, entry_id: str, fields: dict[Any, Any], attempt: int) -> None:
        raw = fields.get(b"event", fields.get("event"))
        try:
            event = Event.from_json(raw)  # type: ignore[arg-type]
        except (ValueError, KeyError, TypeError) as exc:
            self._log.warning("pubsub.malformed_entry", topic=slot.topic, entry_id=entry_id,
                              error=repr(exc))
            slot.entry_of.pop(entry_id, None)
            return
        if attempt > event.delivery_attempt:
            event = Event(event.type, event.data, event.id, event.created_at, attempt)
        if not slot.members or self._slots.get((slot.topic, slot.group)) is not slot:
            return  # the subscription closed meanwhile: the entry stays pending for a later one
        slot.entry_of[event.id] = entry_id
        slot.inflight.add(entry_id)
        if slot.fanout:
            members = [m for m in slot.members if not m._closing]
            if not members:
                return
            slot.refs[entry_id] = len(members)
            for member in members:
                member.queue.put(event)
        else:
            slot.queue.put(event)

    def _kick(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        backoff = 0.1
        while True:
            by_group: dict[str, list[_Slot]] = {}
            for slot in self._slots.values():
                if slot.members:
                    by_group.setdefault(slot.group, []).append(slot)
            if not by_group:
                self._wakeup = anyio.Event()
                with anyio.move_on_after(self.block_ms / 1000):
                    await self._wakeup.wait()
                self._wakeup = None
                continue
            block = max(1, self.block_ms // len(by_group))
            try:
                for group, slots in by_group.items():
                    consumer = slots[0].consumer
                    streams = {s.stream: ">" for s in slots}
                    reply: Any = await reader.xreadgroup(
                        group, consumer, streams, count=64, block=block  # type: ignore[arg-type]
                    )
                    for stream_name, entries in reply or []:
                        slot = next(s for s in slots if s.stream == _text(stream_name))
                        for entry_id, fields in entries:
                            if fields:
                                self._dispatch(slot, _text(entry_id), fields, 1)
                backoff = 0.1
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    for slots in by_group.values():
                        for slot in slots:
                            await self._safe_create(slot)
                else:
                    self._log.warning("pubsub.reader_error", error=repr(exc))
                    await anyio.sleep(backoff)
            except _UNAVAILABLE as exc:
                self._log.warning("pubsub.reader_error", error=repr(exc), retry_in_s=backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _safe_create(self, slot: _Slot) -> None:
        try:
            await self._create_group(slot, "0")
        except BackendUnavailableError as exc:
            self._log.warning("pubsub.reader_error", error=repr(exc))

    async def _reclaim_loop(self) -> None:
        while True:
            await anyio.sleep(self.reclaim_interval_ms / 1000)
            for slot in list(self._slots.values()):
                if slot.fanout or not slot.members:
                    continue
                try:
                    await self._reclaim(slot)
                except (*_UNAVAILABLE, redis.exceptions.ResponseError) as exc:
                    self._log.warning("pubsub.reclaim_failed", topic=slot.topic, error=repr(exc))

    async def _reclaim(self, slot: _Slot) -> None:
        cursor = "0-0"
        while True:
            reply: Any = await self._client.xautoclaim(
                slot.stream, slot.group, slot.consumer, self.reclaim_idle_ms,
                start_id=cursor, count=100,
            )
            cursor = _text(reply[0])
            claimed = reply[1]
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:
                await self._client.xack(slot.stream, slot.group, *[_text(d) for d in deleted])
            fresh = [(i, f) for i, f in claimed if _text(i) not in slot.inflight and f]
            if fresh:
                ids = [_text(i) for i, _ in fresh]
                counts: dict[str, int] = {}
                rows = await self._client.xpending_range(
                    slot.stream, slot.group, min=ids[0], max=ids[-1], count=len(ids) + 100
                )
                for row in rows:
                    counts[_text(row["message_id"])] = int(row["times_delivered"])
                for entry_id, fields in fresh:
                    eid = _text(entry_id)
                    self._log.info("pubsub.reclaimed", topic=slot.topic, entry_id=eid)
                    self._dispatch(slot, eid, fields, counts.get(eid, 2))
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
