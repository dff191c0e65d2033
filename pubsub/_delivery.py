"""The subscription loop both built-in backends share: one task per subscription that hands
queued items to the handler one at a time, with in-place redelivery and a graceful close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Self, TypeVar

import anyio
import anyio.lowlevel

from _signal_leases.logs import get_logger

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from _signal_leases.aio import WakeQueue
    from pubsub._contract import Event, EventHandler

__all__ = ["LoopSubscription", "deliver_with_retries"]

logger = get_logger("pubsub")

T = TypeVar("T")


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


class LoopSubscription:
    """A :class:`~pubsub.Subscription` served by one task that handles one item at a time.

    :meth:`close` lets the item in hand finish, then stops the task (a task waiting for the
    next item is cancelled at once; a waiting :class:`WakeQueue` loses nothing). Leaving
    ``async with subscription:`` closes it.
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def serve(
        self,
        queue: WakeQueue[T],
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
            self._closing = True
            if cleanup is not None:
                cleanup()
            self._done.set()
