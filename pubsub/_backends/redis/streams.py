"""``RedisStreamsPubSub``: durable at-least-once delivery on Redis Streams (the facade).

Layout: one stream per topic, ``<prefix>:topic:<topic>``, the event JSON in field ``event``
(see :mod:`._redis_layout`). The parts, one module each:

* :mod:`._redis_slots`: subscription state, one slot per (stream, group) this process reads,
  and the delivery of one entry (retries, XACK after success, never XDEL);
* :mod:`._redis_groups`: which groups exist and where each group and member starts; private
  fan-out groups (``fanout:<process id>``) are destroyed with their last subscription;
* :mod:`._redis_reader`: the reader connection of the process (XREADGROUP); on a Redis
  Cluster one per node that serves subscribed streams, with no command crossing slots;
* :mod:`._redis_housekeeping`: liveness, reclaim of dead consumers' entries, and the sweep of
  dead processes' private groups.

Streams are bounded: approximate ``MAXLEN`` on every XADD and a sliding idle TTL (``PEXPIRE``,
in the same MULTI as an XADD; from each process at most once every tenth of the TTL per
stream, the other publishes a plain XADD). Every command names one stream or one key, so
every one of them stays in one hash slot on a Redis Cluster. Leases live next to the streams:
:meth:`RedisStreamsPubSub.get_lease_provider`.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Unpack

import anyio

from _signal_leases.aio import owned_task_group
from _signal_leases.errors import BackendError
from _signal_leases.keys import pubsub_layout
from _signal_leases.logs import get_logger
from _signal_leases.redis.support import (
    RedisClientOptions,
    RedisHandle,
    atomic_pipeline,
    map_errors,
)
from _signal_leases.validation import check_identifier, check_int, check_str
from leases import RedisLeaseProvider
from pubsub._backends.redis.groups import GroupTable
from pubsub._backends.redis.housekeeping import Housekeeper
from pubsub._backends.redis.layout import FANOUT, StreamsContext, StreamsLayout, StreamsSettings
from pubsub._backends.redis.reader import StreamReader
from pubsub._backends.redis.slots import RedisSubscription
from pubsub._base import PubSubBase
from pubsub._contract import DEFAULT_MAX_DELIVERY_ATTEMPTS, Event, EventHandler, StartFrom
from pubsub._leased import LeasedPubSub

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import redis.asyncio

__all__ = ["RedisStreamsPubSub"]

logger = get_logger("pubsub")


class RedisStreamsPubSub(PubSubBase, LeasedPubSub):
    """A :class:`~pubsub.PubSub` on Redis Streams.

    Give exactly one of ``url`` or ``client``. A client built from ``url`` (a
    ``redis.asyncio.RedisCluster`` with ``cluster=True``) gets ``socket_timeout`` and a
    waiting pool of ``max_connections``, and is closed on exit; a given ``client`` is never
    closed. ``publish`` works without entering (an XADD); ``subscribe`` needs ``async with``.
    Connection loss and timeouts raise :class:`~pubsub.BackendUnavailableError`; a wrong
    password, a missing ACL permission or a wrong database raise
    :class:`~pubsub.BackendPermanentError`; under trio, :class:`~pubsub.UnsupportedBackendError`.

    ``max_stream_length`` (approximate ``MAXLEN``) and ``stream_idle_ttl_ms`` (sliding
    ``PEXPIRE``, slid by a publish at most every tenth of it: an idle stream goes between 90
    and 100 % of it after its last event) bound each stream; 0 disables a bound. The reader
    blocks up to ``block_ms``. Entries pending on a consumer for ``reclaim_idle_ms`` are
    reclaimed (looked for every ``reclaim_interval_ms``, default half of that), and a process
    silent for ten times ``reclaim_idle_ms`` is taken for dead: its private groups are reaped.
    ``consumer_name`` (no ``:``; unique among live processes) defaults to pid plus random.

    Redis Cluster (``cluster=True``, or a ``RedisCluster`` client): every command names one
    stream or one key, so none crosses slots; the reader reads each stream with an
    ``XREADGROUP`` of its own, on one blocking connection per node that serves subscribed
    streams, and follows failovers and resharding (the streams move to their new node's
    connection). Liveness, reclaim (XAUTOCLAIM) and sweeps work per stream as on one server.

    :meth:`get_lease_provider` returns the ``leases.RedisLeaseProvider`` on the same client
    (keys under ``<key_prefix>:lease``); the signal runtime finds it through
    ``leases.resolve_lease_provider``.
    """

    reserved_group_prefix = FANOUT + ":"
    publish_before_entering = True

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | redis.asyncio.RedisCluster | None = None,
        key_prefix: str = "pubsub",
        max_stream_length: int = 10_000,
        stream_idle_ttl_ms: int = 7 * 86_400_000,
        block_ms: int = 1000,
        reclaim_idle_ms: int = 30_000,
        reclaim_interval_ms: int | None = None,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        consumer_name: str | None = None,
        **options: Unpack[RedisClientOptions],
    ) -> None:
        super().__init__(max_delivery_attempts=max_delivery_attempts)
        check_str("key_prefix", key_prefix)
        if consumer_name is not None and ":" in check_identifier("consumer_name", consumer_name):
            raise ValueError("consumer_name must not contain ':'")
        reclaim_idle_ms = check_int("reclaim_idle_ms", reclaim_idle_ms)
        if reclaim_interval_ms is None:
            reclaim_interval_ms = max(1, reclaim_idle_ms // 2)
        settings = StreamsSettings(
            max_stream_length=check_int("max_stream_length", max_stream_length, minimum=0),
            stream_idle_ttl_ms=check_int("stream_idle_ttl_ms", stream_idle_ttl_ms, minimum=0),
            block_ms=check_int("block_ms", block_ms),
            reclaim_idle_ms=reclaim_idle_ms,
            reclaim_interval_ms=check_int("reclaim_interval_ms", reclaim_interval_ms),
            max_delivery_attempts=self.max_delivery_attempts,
        )
        self._handle = RedisHandle(
            "RedisStreamsPubSub", url=url, client=client, writes=False, **options
        )
        self.process_id = consumer_name or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._ctx = StreamsContext(
            client=self._handle.client,
            layout=StreamsLayout(key_prefix),
            settings=settings,
            process_id=self.process_id,
            log=logger.bind(consumer=self.process_id),
        )
        self._leases = RedisLeaseProvider(  # renewals on two connections of its own
            client=self._handle.client, key_prefix=pubsub_layout(key_prefix)[1],
            dedicated_renewals=True,
        )
        self._groups = GroupTable(self._ctx)
        self._reader = StreamReader(self._groups)
        self._housekeeper = Housekeeper(self._groups)
        self._slid: dict[str, float] = {}  # stream -> when this process last slid its TTL

    # -- properties ------------------------------------------------------------------------

    @property
    def redis_client(self) -> redis.asyncio.Redis:
        """The client for publishing and leases (the signal runtime puts its store on it)."""
        client: redis.asyncio.Redis = self._handle.client
        return client

    @property
    def key_prefix(self) -> str:
        """The prefix of every key this pub/sub writes."""
        return self._ctx.layout.prefix

    def stream_key(self, topic: str) -> str:
        """The Redis key of ``topic``'s stream."""
        return self._ctx.layout.stream(check_identifier("topic", topic))

    def get_lease_provider(self) -> RedisLeaseProvider:
        """The lease provider on this pub/sub's client (keys under ``<key_prefix>:lease``)."""
        return self._leases

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def backend_lifespan(self) -> AsyncIterator[None]:
        """The reader connection(s) and the two loops, while entered (the liveness key comes
        with the first subscription); at exit the private groups and the liveness key go, and a
        client built here is closed."""
        self._handle.require_asyncio()
        try:
            await self._handle.ready()
            with map_errors("connect"):  # a wrong URL or a closed port fails here, at entry
                await self._handle.client.ping()
        except BaseException:
            await self._close_clients()
            raise
        try:
            async with owned_task_group() as tg:
                await tg.start(self._reader.run, name="pubsub redis reader")
                await tg.start(self._housekeeper.run, name="pubsub redis housekeeping")
                yield
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    with map_errors("XGROUP DESTROY"):
                        await self._groups.destroy_all()
                except BackendError as exc:
                    self._ctx.log.debug("pubsub.group_destroy_failed", topic=None, error=repr(exc))
                await self._housekeeper.forget_self()
            await self._close_clients()

    async def _close_clients(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await self._leases.aclose()  # its renewal pool (the shared client is not its own)
            await self._handle.aclose()

    async def close(self) -> None:
        """Close every subscription (in-flight handlers finish first, private groups are
        destroyed) and stop the reader; connections are released when ``async with`` exits."""
        await super().close()
        self._reader.stop()
        self._housekeeper.stop()

    # -- the hooks -------------------------------------------------------------------------

    async def backend_publish(self, topic: str, event: Event, wire: str) -> None:
        self._handle.require_asyncio()
        if not self._handle.initialized:
            await self._handle.ready()
        stream = self._ctx.layout.stream(topic)
        maxlen = self._ctx.settings.max_stream_length or None
        with map_errors(f"publish to {topic!r}"):
            if not self._ttl_due(stream):  # a plain XADD: the TTL was slid a moment ago
                await self.redis_client.xadd(stream, {"event": wire}, maxlen=maxlen,
                                             approximate=True)
                return
            async with atomic_pipeline(self.redis_client) as pipe:
                pipe.xadd(stream, {"event": wire}, maxlen=maxlen, approximate=True)
                self._ctx.queue_idle_ttl(pipe, stream)
                await pipe.execute()
            self._slid[stream] = time.monotonic()

    def _ttl_due(self, stream: str) -> bool:
        """Whether this publish slides ``stream``'s idle TTL: at most once every tenth of
        the TTL per stream and process (between two, the stream cannot expire)."""
        ttl_ms = self._ctx.settings.stream_idle_ttl_ms
        if not ttl_ms:
            return False
        every, now = ttl_ms / 10_000, time.monotonic()  # (a tenth of the TTL, in seconds)
        slid = self._slid.get(stream)
        if slid is not None and now - slid < every:
            return False
        if len(self._slid) >= 10_000:  # keep the memo small: forget what is due anyway
            self._slid = {k: t for k, t in self._slid.items() if now - t < every}
        return True

    async def backend_subscribe(
        self, topic: str, handler: EventHandler, *, group: str | None, start_from: StartFrom
    ) -> RedisSubscription:
        tg = self.task_group
        with map_errors(f"subscribe to {topic!r}"):
            await self._housekeeper.ensure_alive()
        slot, fresh = await self._groups.open(topic, group, start_from)
        sub = RedisSubscription(
            slot, handler, detach=self._groups.detach, wake_reader=self._reader.interrupt
        )
        try:
            await self._groups.attach(slot, sub, fresh=fresh, start_from=start_from)
            await tg.start(sub.run)
        except BaseException:
            sub.abandon()
            with anyio.CancelScope(shield=True):
                await self._groups.detach(sub)
            raise
        if fresh and not slot.fanout:
            await self._groups.read_own_pending(slot)
        if fresh:
            await self._reader.interrupt()  # read the new stream now, not after a block
        return sub
