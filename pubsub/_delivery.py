"""Pieces every backend's subscription loop shares: a wakeable queue and the retry policy."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio
import anyio.lowlevel
import structlog

from ._contract import Subscription

if TYPE_CHECKING:
    from anyio.abc import TaskStatus
    from structlog.typing import FilteringBoundLogger

    from ._contract import Event, EventHandler

__all__ = ["EventQueue", "LoopSubscription", "check_max_attempts", "deliver_with_retries"]

logger: FilteringBoundLogger = structlog.get_logger("pubsub")

T = TypeVar("T")


def check_max_attempts(value: object) -> int:
    """Return ``value`` if it is a positive ``int`` of delivery attempts, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_delivery_attempts must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"max_delivery_attempts must be positive, got {value}")
    return value


class EventQueue(Generic[T]):
    """A FIFO with an awaitable ``get``; cancelling a waiter never loses an item."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._ready: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, event: T) -> None:
        self._items.append(event)
        if self._ready is not None:
            self._ready.set()
            self._ready = None

    def drain(self) -> list[T]:
        """Remove and return every queued item."""
        items = list(self._items)
        self._items.clear()
        return items

    async def get(self) -> T:
        while not self._items:
            if self._ready is None:
                self._ready = anyio.Event()
            await self._ready.wait()
        return self._items.popleft()


async def deliver_with_retries(
    handler: EventHandler,
    event: Event,
    *,
    max_attempts: int,
    topic: str,
    group: str | None,
    on_retry: Callable[[Event], Awaitable[None]] | None = None,
) -> bool:
    """Call ``handler`` until it returns, redelivering in place up to ``max_attempts``.

    Returns ``True`` when the handler succeeded, ``False`` when the event was dropped (after a
    ``pubsub.event_dropped`` warning). Cancellation propagates untouched.
    """
    current = event
    while True:
        try:
            await handler(current)
        except Exception as exc:
            if current.delivery_attempt >= max_attempts:
                logger.warning(
                    "pubsub.event_dropped",
                    topic=topic,
                    group=group,
                    event_id=current.id,
                    attempts=current.delivery_attempt,
                    error=repr(exc),
                )
                return False
            logger.info(
                "pubsub.handler_failed",
                topic=topic,
                group=group,
                event_id=current.id,
                attempt=current.delivery_attempt,
                error=repr(exc),
            )
            current = current.redelivered()
            if on_retry is not None:
                await on_retry(current)
            await anyio.lowlevel.checkpoint()
        else:
            return True


class LoopSubscription(Subscription):
    """A subscription served by one task that handles one item at a time.

    :meth:`close` lets the item in hand finish, then stops the task (a task waiting for the
    next item is cancelled at once; a waiting :class:`EventQueue` loses nothing).
    """

    def __init__(self, topic: str, group: str | None) -> None:
        self.topic = topic
        self.group = group
        self._scope: anyio.CancelScope | None = None
        self._busy = False
        self._closing = False
        self._done = anyio.Event()

    @property
    def closing(self) -> bool:
        """``close`` was called (or serving stopped): hand this subscription nothing more."""
        return self._closing

    def abandon(self) -> None:
        """Mark a subscription whose serving task never started as closed."""
        self._closing = True
        self._done.set()

    async def close(self) -> None:
        if not self._closing:
            self._closing = True
            if not self._busy and self._scope is not None:
                self._scope.cancel()
        await self._done.wait()

    async def serve(
        self,
        queue: EventQueue[T],
        handle: Callable[[T], Awaitable[object]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        """Handle the items of ``queue`` one at a time until closed; ``cleanup`` runs before
        :meth:`close` returns."""
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                task_status.started()
                while not self._closing:
                    item = await queue.get()
                    self._busy = True
                    try:
                        await handle(item)
                    finally:
                        self._busy = False
        finally:
            if cleanup is not None:
                cleanup()
            self._done.set()
