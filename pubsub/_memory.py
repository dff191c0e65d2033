"""``InMemoryPubSub``: the single-process backend (asyncio and trio)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Self

import anyio
import anyio.lowlevel
import structlog

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
from ._errors import PubSubClosedError

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from anyio.abc import TaskGroup, TaskStatus
    from structlog.typing import FilteringBoundLogger

__all__ = ["InMemoryPubSub"]

logger: FilteringBoundLogger = structlog.get_logger("pubsub")


@dataclass
class _Group:
    queue: EventQueue[Event] = field(default_factory=EventQueue)
    members: int = 0


@dataclass
class _Topic:
    retained: deque[Event]
    fanout: list[EventQueue[Event]] = field(default_factory=list)
    groups: dict[str, _Group] = field(default_factory=dict)


_MemorySubscription = LoopSubscription


class InMemoryPubSub(PubSub):
    """A :class:`PubSub` inside one process.

    Keeps the last ``retain`` events per topic for ``start_from="earliest"``. Groups keep
    their undelivered events while they have no member. Use as ``async with InMemoryPubSub()``.
    """

    def __init__(
        self, *, max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS, retain: int = 1000
    ) -> None:
        self.max_delivery_attempts = check_max_attempts(max_delivery_attempts)
        if isinstance(retain, bool) or not isinstance(retain, int) or retain < 0:
            raise ValueError(f"retain must be a non-negative int, got {retain!r}")
        self._retain = retain
        self._topics: dict[str, _Topic] = {}
        self._subs: set[_MemorySubscription] = set()
        self._tg: TaskGroup | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None or self._closed:
            raise PubSubClosedError("an InMemoryPubSub can be entered once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg = self._tg
        self._closed = True
        if tg is None:
            return
        try:
            if exc_type is None:
                await self.close()  # graceful: in-flight handlers finish
        finally:
            tg.cancel_scope.cancel()
            self._tg = None
            await tg.__aexit__(None, None, None)  # the body's own error propagates as is

    async def close(self) -> None:
        """Close every subscription (in-flight handlers finish first); refuse further use."""
        self._closed = True
        for sub in list(self._subs):
            await sub.close()

    def _require_open(self) -> TaskGroup:
        if self._closed:
            raise PubSubClosedError("this InMemoryPubSub is closed")
        if self._tg is None:
            raise PubSubClosedError("enter the InMemoryPubSub first: `async with InMemoryPubSub()`")
        return self._tg

    def _topic(self, topic: str) -> _Topic:
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _Topic(retained=deque(maxlen=self._retain))
        return state

    # -- contract --------------------------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> str:
        check_topic(topic)
        if not isinstance(event, Event):
            raise TypeError(f"publish takes a pubsub.Event, got {type(event).__name__}")
        check_json(event.data)  # the data may have been mutated since the Event was built
        self._require_open()
        state = self._topic(topic)
        state.retained.append(event)
        for queue in state.fanout:
            queue.put(event)
        for group in state.groups.values():
            group.queue.put(event)
        await anyio.lowlevel.checkpoint()
        return event.id

    async def subscribe(
        self,
        topic: str,
        handler: EventHandler,
        *,
        group: str | None = None,
        start_from: StartFrom = "latest",
    ) -> Subscription:
        check_subscribe_args(topic, handler, group, start_from)
        tg = self._require_open()
        state = self._topic(topic)
        if group is None:
            queue: EventQueue[Event] = EventQueue()
            if start_from == "earliest":
                for event in state.retained:
                    queue.put(event)
            state.fanout.append(queue)
        else:
            grp = state.groups.get(group)
            if grp is None:
                grp = state.groups[group] = _Group()
                if start_from == "earliest":
                    for event in state.retained:
                        grp.queue.put(event)
            grp.members += 1
            queue = grp.queue
        sub = _MemorySubscription(topic, group)
        self._subs.add(sub)
        await tg.start(self._serve, sub, queue, handler, state)
        return sub

    async def _serve(
        self,
        sub: _MemorySubscription,
        queue: EventQueue[Event],
        handler: EventHandler,
        state: _Topic,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        def handle(event: Event) -> Awaitable[bool]:
            return deliver_with_retries(
                handler,
                event,
                max_attempts=self.max_delivery_attempts,
                topic=sub.topic,
                group=sub.group,
            )

        def cleanup() -> None:
            if sub.group is None:
                if queue in state.fanout:
                    state.fanout.remove(queue)
            else:
                grp = state.groups.get(sub.group)
                if grp is not None:
                    grp.members -= 1
            self._subs.discard(sub)

        await sub.serve(queue, handle, task_status=task_status, cleanup=cleanup)
