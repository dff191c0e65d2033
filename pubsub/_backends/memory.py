"""``InMemoryPubSub``: the single-process backend (asyncio and trio), with its own leases."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from _signal_leases.aio import WakeQueue, checkpoint
from _signal_leases.validation import check_int
from leases import InMemoryLeaseProvider
from pubsub._base import PubSubBase
from pubsub._contract import DEFAULT_MAX_DELIVERY_ATTEMPTS, Event, EventHandler, StartFrom
from pubsub._delivery import LoopSubscription, deliver_with_retries
from pubsub._leased import LeasedPubSub

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from anyio.abc import TaskStatus

__all__ = ["InMemoryPubSub"]


@dataclass
class _Group:
    queue: WakeQueue[Event] = field(default_factory=WakeQueue)
    members: int = 0


@dataclass
class _Topic:
    retained: deque[Event]
    fanout: list[WakeQueue[Event]] = field(default_factory=list)
    groups: dict[str, _Group] = field(default_factory=dict)


class InMemoryPubSub(PubSubBase, LeasedPubSub):
    """A :class:`~pubsub.PubSub` inside one process.

    Keeps the last ``retain`` events per topic for ``start_from="earliest"``. Groups keep
    their undelivered events while they have no member. Use as ``async with InMemoryPubSub()``.
    :meth:`get_lease_provider` returns the :class:`leases.InMemoryLeaseProvider` this pub/sub
    owns, so every signal runtime built on it coordinates thread ownership through it.
    """

    def __init__(
        self, *, max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS, retain: int = 1000
    ) -> None:
        super().__init__(max_delivery_attempts=max_delivery_attempts)
        self._retain = check_int("retain", retain, minimum=0)
        self._topics: dict[str, _Topic] = {}
        self._leases = InMemoryLeaseProvider()

    def get_lease_provider(self) -> InMemoryLeaseProvider:
        """The lease provider of this pub/sub (one per instance, shared by its users)."""
        return self._leases

    def _topic(self, topic: str) -> _Topic:
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _Topic(retained=deque(maxlen=self._retain))
        return state

    async def backend_publish(self, topic: str, event: Event, wire: str) -> None:
        state = self._topic(topic)
        state.retained.append(event)
        for queue in state.fanout:
            queue.put(event)
        for group in state.groups.values():
            group.queue.put(event)
        await checkpoint()

    async def backend_subscribe(
        self, topic: str, handler: EventHandler, *, group: str | None, start_from: StartFrom
    ) -> LoopSubscription:
        state = self._topic(topic)
        if group is None:
            queue: WakeQueue[Event] = WakeQueue()
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
        sub = LoopSubscription(topic, group)
        await self.task_group.start(self._serve, sub, queue, handler, state)
        return sub

    async def _serve(
        self,
        sub: LoopSubscription,
        queue: WakeQueue[Event],
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

        await sub.serve(queue, handle, task_status=task_status, cleanup=cleanup)
