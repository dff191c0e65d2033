"""``RedisSignalSender``: send signals to the workers of a Redis, from a process that runs no
thread (a serverless function, a webhook, a cron job), importing little more than redis-py.

It makes the same call as the ``send`` of a sender-only ``SignalRuntime`` (``agent=None``) on a
``RedisStreamsPubSub``: the Redis core's route script (:class:`RedisFused`), the shared steps of
``signals._sending``, the same logs and the same span. What it leaves out is what a process
that runs no thread has no use for: anyio, task groups, the heartbeat, the follower, the
notice listener. So a fresh process that imports it, sends and exits costs 1.2 times what one
doing a raw redis-py ``XADD`` and ``PUBLISH`` does (1.5 with a runtime; docs/performance.md).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Unpack

from _signal_leases.errors import ClosedError
from _signal_leases.keys import LeaseKeys, pubsub_layout
from _signal_leases.logs import get_logger
from _signal_leases.validation import check_identifier, check_str
from signals._backends.redis.fused import RedisFused
from signals._backends.redis.inbox import InboxOptions
from signals._model import (
    DEFAULT_MAX_SIGNAL_BYTES,
    Delivery,
    EntryMode,
    IfActive,
    IfIdle,
    Receipt,
    Signal,
    check_max_bytes,
)
from signals._sending import check_limits, delivered, prepare, refused_after, refused_before
from signals._telemetry import Telemetry
from signals.kit._core import Overflow

if TYPE_CHECKING:
    import redis.asyncio

    from leases import RedisLeaseProvider

__all__ = ["RedisSignalSender"]

logger = get_logger("signals")


class RedisSignalSender:
    """Sends signals to threads run by workers on Redis, from a process that runs none.

    ``key_prefix`` is the workers' ``RedisStreamsPubSub(key_prefix=...)`` (default
    ``"pubsub"``): the sender writes to their store and reads their leases. Give exactly one
    of ``url`` or ``client`` (only a client built from ``url`` is closed); the client options
    (``cluster``, ``socket_timeout``, ``max_connections``, ``wait_replicas``, ...) are those of
    every Redis backend. ``max_signal_bytes``, ``max_pending_per_thread`` and ``overflow``
    are the runtime's options of the same names; ``retention_ms``, ``max_receipts``,
    ``idle_ttl_ms``, ``stream_max_parts`` and ``stream_retention_ms`` those of the workers'
    ``RedisSignalStore`` when they changed them.

    :meth:`send` is a sender-only runtime's ``send``: same arguments, same outcomes
    (``queued``, ``deliver``, ``scheduled``, ``discarded``, ``rejected``, ``unchanged``;
    never ``wake``: this process runs no thread), same guarantee (it returns once the signal
    is stored and the owner or the workers told). asyncio only (redis-py). A ``coalesce`` lane
    needs its reducer in the workers' runtimes, not here. ``if_active="discard"``/``"reject"``
    and ``if_idle="discard"`` read the thread's lease first, through a ``RedisLeaseProvider``
    made on first use (it loads the lease layer, and anyio). :meth:`receipt` reads what became
    of a signal. A ``key_prefix`` no worker listens under is not an error: on one Redis the
    send logs the warning ``signal.unheard``.

    Use it as an async context manager, or call :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | None = None,
        key_prefix: str = "pubsub",
        max_signal_bytes: int = DEFAULT_MAX_SIGNAL_BYTES,
        max_pending_per_thread: int | None = None,
        overflow: Overflow = "reject",
        **options: Unpack[InboxOptions],
    ) -> None:
        check_str("key_prefix", key_prefix)
        self.key_prefix = key_prefix
        self.max_signal_bytes = check_max_bytes(max_signal_bytes)
        self.limits = check_limits(max_pending_per_thread, overflow)
        signals_prefix, self._lease_prefix = pubsub_layout(key_prefix)
        self._core = RedisFused(
            "RedisSignalSender", url=url, client=client, key_prefix=signals_prefix,
            lease_keys=LeaseKeys(self._lease_prefix), **options,
        )
        self.client: redis.asyncio.Redis = self._core.client
        self._leases: RedisLeaseProvider | None = None
        self._telemetry = Telemetry()
        self._log = logger.bind()
        self._closed = False

    async def __aenter__(self) -> Self:
        self._core._handle.require_asyncio()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client if this sender built it; a later :meth:`send` raises
        :class:`ClosedError`."""
        self._closed = True
        await self._core.aclose()

    async def send(
        self,
        thread_key: str,
        signal: Signal | Any,
        *,
        if_active: IfActive = "deliver",
        if_idle: IfIdle = "wake",
        delay_ms: int | None = None,
        expires_in_ms: int | None = None,
    ) -> Delivery:
        """Accept ``signal`` for ``thread_key`` and route it, as ``SignalRuntime.send`` does
        in a runtime with no agent: a value that is not a :class:`Signal` becomes the payload
        of a ``user`` signal; an idle thread's signal is ``queued`` and the workers told
        (``wake`` and ``enqueue`` alike), an active thread's goes to its run (``deliver``),
        after it (``queue``), or cancels it (``interrupt``). Backend errors propagate."""
        if self._closed:
            raise ClosedError("this RedisSignalSender is closed")
        signal = prepare(thread_key, signal, if_active, if_idle, delay_ms, expires_in_ms)
        if self._telemetry.quiet():
            return await self._send(thread_key, signal, if_active, if_idle)
        return await self._telemetry.traced_send(
            thread_key, signal, lambda s: self._send(thread_key, s, if_active, if_idle))

    async def _send(self, thread_key: str, signal: Signal, if_active: IfActive,
                    if_idle: IfIdle) -> Delivery:
        signal.encode(self.max_signal_bytes)  # SignalTooLargeError before anything is written
        log = self._log.bind(key=thread_key, signal_id=signal.id)
        if if_active in ("discard", "reject") or if_idle == "discard":
            owner = await self._lease_provider().get_lease_owner(thread_key)
            refused = refused_before(owner, thread_key, signal, if_active, if_idle, log)
            if refused is not None:
                return refused
        mode: EntryMode = "queue" if if_active == "queue" else "deliver"
        routed = await self._core.route(thread_key, signal, mode, claim=None, sender=None,
                                        wake_workers=True, limits=self.limits,
                                        interrupt=if_active == "interrupt")
        refused = refused_after(routed, thread_key, signal, log)
        if refused is not None:
            return refused
        return delivered(routed, thread_key, signal, mode, log)

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        """What became of ``signal_id`` on ``thread_key`` (``pending``, ``scheduled``,
        ``processed`` with its result, ...; ``None``: unknown or past retention), as
        ``SignalRuntime.receipt`` says it."""
        check_identifier("thread key", thread_key)
        check_identifier("signal id", signal_id)
        if self._closed:
            raise ClosedError("this RedisSignalSender is closed")
        return await self._core.receipt(thread_key, signal_id)

    def _lease_provider(self) -> RedisLeaseProvider:
        """The workers' lease provider on this sender's client, made on first use (it imports
        the lease layer, and anyio with it)."""
        if self._leases is None:
            from leases import RedisLeaseProvider

            self._leases = RedisLeaseProvider(client=self.client, key_prefix=self._lease_prefix)
        return self._leases
